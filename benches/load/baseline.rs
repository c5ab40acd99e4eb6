//! The baseline server: the webhook's own accept loop, TLS configuration and hyper-util
//! connection builder (`kube_object_lock::server::serve`), in front of a service that drains
//! the request body without looking at it and answers a constant "allowed" AdmissionReview.
//!
//! It runs as a subprocess of the benchmark (the benchmark executable re-run with a hidden
//! flag), on the same kind of tokio runtime as the webhook, so its CPU time and RSS compare with
//! the webhook's. Whatever the webhook costs above it is the cost of parsing, deciding, looking
//! locks up and answering.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use bytes::{Buf, Bytes};
use futures::StreamExt;
use http::{HeaderValue, header};
use kube_object_lock::server;
use kube_object_lock::settings::Settings;
use kube_object_lock::tls::{self, CertStore};
use warp::Filter;

/// What every request gets: allowed, no uid (the API server would refuse it, the floor is all
/// it measures).
const ANSWER: &[u8] =
    br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":true}}"#;

/// Serves the baseline on `addr` until SIGTERM or SIGINT.
pub fn serve(addr: &str, cert: &str, key: &str) -> anyhow::Result<()> {
    let addr: SocketAddr = addr.parse().context("baseline listen address")?;
    let certs = CertStore::new(tls::load_pair(Path::new(cert), Path::new(key))?);
    let config = tls::server_config(certs, None)?;
    // The same runtime the webhook's main builds.
    let runtime = tokio::runtime::Runtime::new().context("runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("bind {addr}"))?;
        let limits = &Settings::default().server;
        let route = warp::any().and(warp::body::stream()).then(drain_and_answer);
        server::serve(
            listener,
            Some(config),
            warp::service(route),
            limits,
            kube_object_lock::app::shutdown_signal(),
        )
        .await;
        Ok(())
    })
}

/// Reads every byte of the body, as any webhook must, keeps none of it, and answers.
async fn drain_and_answer<B: Buf>(
    body: impl futures::Stream<Item = Result<B, warp::Error>>,
) -> warp::reply::Response {
    let mut body = std::pin::pin!(body);
    while let Some(Ok(mut chunk)) = body.next().await {
        let n = chunk.remaining();
        chunk.advance(n);
    }
    answer()
}

fn answer() -> warp::reply::Response {
    let mut response = warp::reply::Response::new(Bytes::from_static(ANSWER).into());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
