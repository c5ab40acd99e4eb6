//! The warp routes: `POST /validate`, the probes, and `GET /metrics` on the metrics listener.
//! Invariant: what is not a usable AdmissionReview gets a 4xx with a Kubernetes `Status` body,
//! once its body is in; the routes know nothing of TLS or sockets.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures::{Stream, StreamExt};
use http::{HeaderValue, Method, StatusCode, header};
use http_body::Frame;
use warp::Filter;
use warp::reply::Response;

use crate::admission::Reviewer;
use crate::locks::LockSource;

/// A liveness check: `Err` says why the process is unhealthy.
pub type HealthCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

#[derive(Clone)]
pub struct Probes {
    pub health: Vec<HealthCheck>,
    /// The lock source, ready once synced (`/readyz`).
    pub source: Arc<dyn LockSource>,
}

pub struct State {
    pub probes: Probes,
    pub reviewer: Reviewer,
    pub max_body_bytes: u64,
    pub body_timeout: Duration,
    pub invalid: prometheus_client::metrics::counter::Counter,
}

pub fn routes(
    state: Arc<State>,
) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone + Send + Sync + 'static {
    let probes = probes(state.probes.clone());
    let invalid = state.invalid.clone();
    let with_state = warp::any().map(move || state.clone());
    let query = warp::query::raw().or(warp::any().map(String::new)).unify();
    let validate = warp::path!("validate")
        .and(warp::method())
        .and(header_value("content-type"))
        .and(header_value("content-length"))
        .and(query)
        .and(warp::body::stream())
        .and(with_state)
        .then(answer)
        .map(move |response: Response| {
            if response.status().is_client_error() {
                invalid.inc();
            }
            response
        });
    // Any other path: 404, once the body is in (see [`refuse_early`]).
    let elsewhere = warp::body::stream().then(|mut body| async move {
        let message =
            "no such path; the webhook serves POST /validate, GET /healthz and GET /readyz";
        refuse_early(
            &mut body,
            failure(StatusCode::NOT_FOUND, message.to_owned()),
        )
        .await
    });
    let routes = validate.or(probes).unify().or(elsewhere).unify();
    routes.recover(rejection).unify()
}

/// `GET /healthz` and `GET /readyz` (the lock source has synced).
pub fn probes(
    probes: Probes,
) -> impl Filter<Extract = (Response,), Error = warp::Rejection> + Clone + Send + Sync + 'static {
    let probes = Arc::new(probes);
    let with_probes = warp::any().map(move || probes.clone());
    let healthz = warp::path!("healthz")
        .and(warp::method())
        .and(with_probes.clone())
        .map(|method: Method, probes: Arc<Probes>| {
            probe(&method, probes.health.iter().try_for_each(|check| check()))
        });
    let readyz = warp::path!("readyz")
        .and(warp::method())
        .and(with_probes)
        .map(|method: Method, probes: Arc<Probes>| probe(&method, probes.source.readiness()));
    healthz.or(readyz).unify()
}

/// `GET /metrics` and the probes, in plain HTTP: a health check needs no client certificate.
pub fn metrics_routes(
    render: Arc<dyn Fn() -> String + Send + Sync>,
    probes: Probes,
) -> impl Filter<Extract = (Response,), Error = Infallible> + Clone + Send + Sync + 'static {
    use warp::Reply;
    warp::path!("metrics")
        .and(warp::get())
        .map(move || {
            warp::reply::with_header(
                render(),
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
            .into_response()
        })
        .or(self::probes(probes))
        .unify()
        .recover(|_| async {
            Ok::<_, Infallible>(
                warp::reply::with_status(
                    "only GET /metrics, /healthz and /readyz are served here\n",
                    StatusCode::NOT_FOUND,
                )
                .into_response(),
            )
        })
        .unify()
}

fn header_value(
    name: &'static str,
) -> impl Filter<Extract = (Option<HeaderValue>,), Error = Infallible> + Clone + Send + Sync {
    warp::header::value(name)
        .map(Some)
        .or(warp::any().map(|| None))
        .unify()
}

async fn answer(
    method: Method,
    content_type: Option<HeaderValue>,
    content_length: Option<HeaderValue>,
    query: String,
    mut body: impl Stream<Item = Result<impl Buf, warp::Error>> + Unpin,
    state: Arc<State>,
) -> Response {
    let body = &mut body;
    if method != Method::POST {
        return allow_only(&method, "POST");
    }
    let content_type = content_type
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        let message = format!("content type is {content_type:?}, expected \"application/json\"");
        return refuse_early(body, failure(StatusCode::BAD_REQUEST, message)).await;
    }
    let deadline = match api_server_timeout(&query) {
        Ok(deadline) => deadline,
        Err(message) => {
            return refuse_early(body, failure(StatusCode::BAD_REQUEST, message)).await;
        }
    };
    let declared_length = content_length
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared_length.is_some_and(|length| length > state.max_body_bytes) {
        return refuse_early(body, too_large(state.max_body_bytes)).await;
    }
    let body = match tokio::time::timeout(
        state.body_timeout,
        collect(&mut *body, state.max_body_bytes),
    )
    .await
    {
        Ok(Ok(body)) => body,
        Ok(Err(BodyError::TooLarge)) => {
            return refuse_early(body, too_large(state.max_body_bytes)).await;
        }
        Ok(Err(BodyError::Read(message))) => {
            return failure(
                StatusCode::BAD_REQUEST,
                format!("cannot read body: {message}"),
            );
        }
        Err(_) => {
            return failure(
                StatusCode::REQUEST_TIMEOUT,
                format!("body not received within {:?}", state.body_timeout),
            );
        }
    };
    match state.reviewer.review(&body, deadline).await {
        Ok(answer) => match serde_json::to_vec(&answer.review) {
            Ok(json) => json_response(StatusCode::OK, json),
            Err(e) => failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot encode response: {e}"),
            ),
        },
        Err(error) => failure(StatusCode::BAD_REQUEST, error.to_string()),
    }
}

/// The API server appends `?timeout=10s`; it bounds how long the answer may take.
fn api_server_timeout(query: &str) -> Result<Option<Duration>, String> {
    for pair in query.split('&') {
        if let Some(value) = pair.strip_prefix("timeout=") {
            return humantime::parse_duration(value).map(Some).map_err(|e| {
                format!("query parameter timeout={value:?} is not a duration like 10s: {e}")
            });
        }
    }
    Ok(None)
}

enum BodyError {
    TooLarge,
    Read(String),
}

/// How much of a refused request's body is drained before the answer, and for how long.
const DISCARD_BYTES: usize = 16 * 1024 * 1024;
const DISCARD_TIME: Duration = Duration::from_secs(2);

/// Answers a refused request once its body is drained (within the bounds above): HTTP/1.1
/// otherwise closes the connection, and HTTP/2 races the client's last DATA frames.
async fn refuse_early(
    body: &mut (impl Stream<Item = Result<impl Buf, warp::Error>> + Unpin),
    response: Response,
) -> Response {
    let discard = async {
        let mut read = 0;
        while let Some(Ok(chunk)) = body.next().await {
            read += chunk.remaining();
            if read > DISCARD_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DISCARD_TIME, discard).await;
    response
}

/// The whole body, at most `limit` bytes; one chunk is hyper's own bytes, not a copy.
async fn collect(
    body: impl Stream<Item = Result<impl Buf, warp::Error>> + Unpin,
    limit: u64,
) -> Result<Bytes, BodyError> {
    use http_body_util::{BodyExt, LengthLimitError, Limited, StreamBody};
    let frames = body.map(|chunk| chunk.map(|mut c| Frame::data(c.copy_to_bytes(c.remaining()))));
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    match Limited::new(StreamBody::new(frames), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(BodyError::TooLarge),
        Err(e) => Err(BodyError::Read(e.to_string())),
    }
}

fn probe(method: &Method, state: Result<(), String>) -> Response {
    if method != Method::GET && method != Method::HEAD {
        return allow_only(method, "GET, HEAD");
    }
    let answer = match state {
        Ok(()) => warp::reply::with_status("ok\n".to_owned(), StatusCode::OK),
        Err(why) => warp::reply::with_status(
            format!("not ready: {why}\n"),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
    };
    warp::Reply::into_response(answer)
}

fn allow_only(method: &Method, allowed: &'static str) -> Response {
    let mut response = failure(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} is not allowed here; use {allowed}"),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allowed));
    response
}

fn too_large(limit: u64) -> Response {
    failure(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("body is larger than the limit of {limit} bytes"),
    )
}

/// What no route answered: every path has one, so only a request warp could not read.
async fn rejection(rejection: warp::Rejection) -> Result<Response, Infallible> {
    let message = format!("bad request: {rejection:?}");
    Ok(failure(StatusCode::BAD_REQUEST, message))
}

/// A Kubernetes `Status` body, the error shape API clients expect.
fn failure(status: StatusCode, message: String) -> Response {
    let reason = match status {
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowed",
        StatusCode::PAYLOAD_TOO_LARGE => "RequestEntityTooLarge",
        StatusCode::REQUEST_TIMEOUT => "Timeout",
        StatusCode::INTERNAL_SERVER_ERROR => "InternalError",
        _ => "BadRequest",
    };
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": status.as_u16(),
    });
    json_response(status, body.to_string().into_bytes())
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = Response::new(body.into());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(parts: &[&'static [u8]]) -> impl Stream<Item = Result<Bytes, warp::Error>> + Unpin {
        futures::stream::iter(
            parts
                .iter()
                .map(|p| Ok(Bytes::from_static(p)))
                .collect::<Vec<_>>(),
        )
    }

    /// A body in one chunk is hyper's own bytes, not a copy; one in several is joined; either
    /// is refused beyond the limit.
    #[tokio::test]
    async fn bodies_are_collected_whole() {
        static WHOLE: &[u8] = br#"{"kind":"AdmissionReview"}"#;
        let one = collect(chunks(&[WHOLE]), 100)
            .await
            .ok()
            .expect("collected");
        assert_eq!(&one[..], WHOLE);
        assert_eq!(one.as_ptr(), WHOLE.as_ptr(), "one chunk is not copied");
        let three = collect(chunks(&[b"{\"kind\":", b"\"Admission", b"Review\"}"]), 100)
            .await
            .ok()
            .expect("collected");
        assert_eq!(&three[..], WHOLE);
        let empty = collect(chunks(&[]), 100).await.ok().expect("collected");
        assert!(empty.is_empty());
        for parts in [&[WHOLE][..], &[&WHOLE[..20], &WHOLE[20..]]] {
            assert!(matches!(
                collect(chunks(parts), 25).await,
                Err(BodyError::TooLarge)
            ));
            assert!(collect(chunks(parts), 26).await.is_ok());
        }
    }

    #[test]
    fn timeout_query_is_read() {
        assert_eq!(api_server_timeout(""), Ok(None));
        assert_eq!(
            api_server_timeout("timeout=10s"),
            Ok(Some(Duration::from_secs(10)))
        );
        assert_eq!(
            api_server_timeout("a=b&timeout=500ms"),
            Ok(Some(Duration::from_millis(500)))
        );
        assert!(api_server_timeout("timeout=soon").is_err());
    }
}
