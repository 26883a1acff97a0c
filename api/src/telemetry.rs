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
//!
//! Traces (off by default): with `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, the same spans go to an OpenTelemetry collector over
//! OTLP/HTTP (`opentelemetry-otlp`, through `tracing-opentelemetry`): one trace per request, the
//! HTTP span at its root, the engine's span under it with the request's `queue`, `prefill` and
//! `decode` phases. `OTEL_EXPORTER_OTLP_PROTOCOL` is `http/protobuf` (default) or `http/json`;
//! `OTEL_SERVICE_NAME` defaults to `cachet`; `OTEL_SDK_DISABLED=true` turns it off.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::HttpMessage;
use opentelemetry_otlp::Protocol;
use std::time::Instant;
use tracing::Span;
use tracing_actix_web::{RequestId, RootSpanBuilder};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

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
                // Probes poll: a 503 from `/readyz` while the model loads is the answer working,
                // not a fault (an engine that died is logged as an error where it is seen).
                let probe = matches!(response.request().path(), "/healthz" | "/readyz");
                if probe {
                    tracing::debug!(status, ms = format_args!("{ms:.1}"), "request");
                } else if response.status().is_server_error() {
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

/// What [`init`] set up. Dropping it exports the spans not yet sent (give it until the process
/// ends: `let _telemetry = init(…)?;` in `main`).
#[derive(Debug)]
#[must_use = "dropping it ends the trace export"]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.shutdown() {
                eprintln!("warning: exporting the last traces failed: {e}");
            }
        }
    }
}

/// An unusable trace configuration (the message names the variable).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TelemetryError(pub String);

/// Installs the global subscriber (once; later calls install nothing): logs on stderr and, where
/// the environment names an OTLP endpoint, trace export. An unusable trace configuration is an
/// error (a typo must not silently lose every trace).
pub fn init(format: LogFormat) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal: a log file or a collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let logs = match format {
        LogFormat::Human => logs.boxed(),
        LogFormat::Json => logs.json().boxed(),
    };
    let provider = otlp(|name| std::env::var(name).ok()).map_err(TelemetryError)?;
    let traces = provider.as_ref().map(|p| {
        use opentelemetry::trace::TracerProvider as _;
        tracing_opentelemetry::layer().with_tracer(p.tracer("cachet"))
    });
    let _ = tracing_subscriber::registry().with(filter).with(logs).with(traces).try_init();
    Ok(Telemetry { provider })
}

/// Where traces go, from the standard OpenTelemetry variables (`env` reads one): `None` when
/// no endpoint is set.
fn otlp_target(env: impl Fn(&str) -> Option<String>) -> Result<Option<(String, Protocol)>, String> {
    let set = |name: &str| env(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let url = match (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), set("OTEL_EXPORTER_OTLP_ENDPOINT")) {
        (Some(traces), _) => traces,
        (None, Some(base)) => format!("{}/v1/traces", base.trim_end_matches('/')),
        (None, None) => return Ok(None),
    };
    if !url.starts_with("http://") {
        return Err(format!(
            "OTLP endpoint {url:?}: only http:// is supported (send traces to a collector on the host or \
             the cluster's network, which may forward them over TLS)"
        ));
    }
    let protocol = set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"));
    let protocol = match protocol.as_deref() {
        None | Some("http/protobuf") => Protocol::HttpBinary,
        Some("http/json") => Protocol::HttpJson,
        Some(other) => {
            return Err(format!("OTLP protocol {other:?} is not supported (http/protobuf, http/json)"));
        }
    };
    Ok(Some((url, protocol)))
}

/// The trace pipeline for [`otlp_target`]'s endpoint: spans are batched and sent from a thread
/// of their own, never on a request's path.
fn otlp(env: impl Fn(&str) -> Option<String>) -> Result<Option<opentelemetry_sdk::trace::SdkTracerProvider>, String> {
    use opentelemetry_otlp::WithExportConfig;
    let Some((url, protocol)) = otlp_target(&env)? else { return Ok(None) };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url.clone())
        .with_protocol(protocol)
        .build()
        .map_err(|e| format!("OTLP exporter for {url}: {e}"))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if env("OTEL_SERVICE_NAME").is_none_or(|v| v.trim().is_empty()) {
        resource = resource.with_service_name("cachet");
    }
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    Ok(Some(provider))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(vars: &[(&str, &str)]) -> Result<Option<(String, Protocol)>, String> {
        otlp_target(|name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn the_trace_endpoint_comes_from_the_standard_variables_and_a_bad_one_is_refused() {
        assert_eq!(target(&[]), Ok(None), "off by default");
        assert_eq!(
            target(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]),
            Ok(Some(("http://collector:4318/v1/traces".into(), Protocol::HttpBinary)))
        );
        assert_eq!(
            target(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:4318/traces"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ]),
            Ok(Some(("http://b:4318/traces".into(), Protocol::HttpJson)))
        );
        let sdk_off = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"), ("OTEL_SDK_DISABLED", "TRUE")];
        assert_eq!(target(&sdk_off), Ok(None));
        let grpc = target(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
        assert!(grpc.unwrap_err().contains("\"grpc\" is not supported"));
        let tls = target(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://a:4318")]);
        assert!(tls.unwrap_err().contains("only http://"));
    }
}
