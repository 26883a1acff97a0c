//! A deadline for reading a request's body, on every route.
//!
//! actix-web's `client_request_timeout` bounds the request head only: a client that declares a
//! 4 MB body and sends a byte a second holds its socket, and a worker's attention, for as long as
//! it likes — unauthenticated, on a webhook route that must read the body before it can check
//! its signature. Here the body must arrive whole within `server.body_timeout_secs` of the head;
//! past that the handler's read fails, the answer is a 408, and the connection is closed (the
//! unread rest is not drained).

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, BoxBody, MessageBody};
use actix_web::dev::{Payload, Service, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::web::Bytes;
use actix_web::{HttpMessage, ResponseError};
use futures_util::Stream;

use crate::error::ApiError;

/// The request's payload once its deadline passed, kept unread until the answer is sent (see
/// [`KeepUnread`]).
type Expired = Rc<RefCell<Option<Payload>>>;

/// Runs `srv` with the request's body under `timeout`; a body that did not arrive in time is
/// answered 408, whatever the handler made of the failed read.
pub(crate) fn call<S>(
    mut req: ServiceRequest,
    srv: &S,
    timeout: Duration,
) -> impl Future<Output = Result<ServiceResponse<BoxBody>, actix_web::Error>> + use<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<BoxBody>, Error = actix_web::Error>,
{
    let expired: Expired = Rc::default();
    let inner = req.take_payload();
    let deadline =
        Deadline { inner, sleep: Box::pin(tokio::time::sleep(timeout)), expired: expired.clone(), done: false };
    req.set_payload(Payload::Stream { payload: Box::pin(deadline) });
    let fut = srv.call(req);
    async move {
        let res = fut.await?;
        let Some(unread) = expired.borrow_mut().take() else { return Ok(res) };
        let answer = ApiError::RequestTimeout(timeout.as_secs())
            .error_response()
            .map_body(|_, body| BoxBody::new(KeepUnread { body, _unread: unread }));
        Ok(res.into_response(answer))
    }
}

/// An answer's body that keeps the request's unread body alive until it is sent whole: actix
/// decides then whether to close the connection or to read on (and drain a chunked body, for as
/// long as its sender trickles).
struct KeepUnread {
    body: BoxBody,
    _unread: Payload,
}

impl MessageBody for KeepUnread {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_next(cx)
    }
}

struct Deadline {
    inner: Payload,
    sleep: Pin<Box<tokio::time::Sleep>>,
    expired: Expired,
    done: bool,
}

impl Stream for Deadline {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            self.done = true;
            let unread = std::mem::replace(&mut self.inner, Payload::None);
            *self.expired.borrow_mut() = Some(unread);
            let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "the request body did not arrive in time");
            return Poll::Ready(Some(Err(PayloadError::Io(e))));
        }
        let next = Pin::new(&mut self.inner).poll_next(cx);
        if let Poll::Ready(None) = next {
            self.done = true;
        }
        next
    }
}
