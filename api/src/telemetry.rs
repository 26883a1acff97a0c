//! Logging: `tracing` to stderr, human-readable or JSON, filtered by
//! `RUST_LOG` (default `info`), and one span per HTTP request
//! ([`RequestSpan`], through tracing-actix-web) whose end is the access log line.
//!
//! One request's lines share its id: the HTTP span's `request_id` is the id of the response
//! (`chatcmpl-…`, `resp_…`) and of its ledger row; a model request fills in the span's `tenant`,
//! `endpoint`, `session` and `task`, and the engine logs the request's events (`queued`,
//! `admitted`, `first token`, `finished`, at debug) and the ledger its row (`ledger row`, at
//! debug) inside a child span of it. `cachet --log-format json serve` with
//! `RUST_LOG=info,cachet_engine=debug,cachet_api=debug` writes them all; select one request with
//! `grep <request id>`.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::HttpMessage;
use std::time::Instant;
use tracing::Span;
use tracing_actix_web::{RequestId, RootSpanBuilder};
use tracing_subscriber::EnvFilter;

/// The root span of every HTTP request: method, route, path, client and request id, then status
/// and latency in the access log event at its end. Only the path is recorded, never the query
/// string or a header: a credential someone put in a URL (`?token=…`) must not reach the logs.
#[derive(Debug)]
pub struct RequestSpan;

/// When the request started (kept in its extensions for the access log's latency).
struct Started(Instant);

impl RootSpanBuilder for RequestSpan {
    fn on_request_start(request: &ServiceRequest) -> Span {
        request.extensions_mut().insert(Started(Instant::now()));
        let request_id = request.extensions().get::<RequestId>().map(|id| id.to_string()).unwrap_or_default();
        let client = request.connection_info().peer_addr().unwrap_or("-").to_string();
        tracing::info_span!(
            "http",
            method = %request.method(),
            path = %request.path(),
            route = request.match_pattern().as_deref().unwrap_or("-"),
            client = %client,
            request_id = %request_id,
            tenant = tracing::field::Empty,
            endpoint = tracing::field::Empty,
            session = tracing::field::Empty,
            task = tracing::field::Empty,
        )
    }

    fn on_request_end<B: MessageBody>(span: Span, outcome: &Result<ServiceResponse<B>, actix_web::Error>) {
        let _enter = span.enter();
        match outcome {
            Ok(response) => {
                let ms = response
                    .request()
                    .extensions()
                    .get::<Started>()
                    .map_or(0.0, |s| s.0.elapsed().as_secs_f64() * 1000.0);
                let status = response.status().as_u16();
                if response.status().is_server_error() {
                    tracing::warn!(status, ms = format_args!("{ms:.1}"), "request");
                } else {
                    tracing::info!(status, ms = format_args!("{ms:.1}"), "request");
                }
            }
            Err(e) => tracing::warn!(error = %e, "request failed"),
        }
    }
}

/// The id of an HTTP request (the one in its span, from tracing-actix-web): a model request's
/// response and ledger row take it, so one id selects the request's log lines and its row.
pub fn request_id(http: &actix_web::HttpRequest) -> cachet_tenants::RequestId {
    cachet_tenants::RequestId(http.extensions().get::<RequestId>().map_or_else(uuid::Uuid::new_v4, |id| **id))
}

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Human,
    Json,
}

/// Installs the global subscriber (once; later calls do nothing).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal: a log file or a collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
