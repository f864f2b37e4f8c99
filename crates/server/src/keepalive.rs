//! A response to a request whose body was never read to its end says
//! `Connection: close`.
//!
//! hyper keeps an HTTP/1 connection alive after such a response only if it
//! can drain the rest of the body at once; when the body has not arrived
//! yet (a client writes headers and body in two pieces, a slow upload, a
//! refusal that came first: 401, 404, 413, 503), it closes the connection
//! instead, without saying so, and the client's next request on it fails
//! ("server disconnected without sending a response"). Saying so lets every
//! client open a new connection for its next request.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};

/// Middleware: watch the request body; if the handler answered without
/// reading it to its end, close the connection after the response.
pub async fn close_if_body_unread(req: Request, next: Next) -> Response {
    if http_body::Body::is_end_stream(req.body()) {
        return next.run(req).await;
    }
    let ended = Arc::new(AtomicBool::new(false));
    let req = req.map(|inner| Body::new(Watched { inner, ended: ended.clone() }));
    let mut response = next.run(req).await;
    if !ended.load(Ordering::Acquire) {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that records when it has been read to its end.
struct Watched {
    inner: Body,
    ended: Arc<AtomicBool>,
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.ended.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
