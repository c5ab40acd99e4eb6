//! A liveness probe beside the lock watches: `GET /livez?exclude=etcd` every 500 ms, 1 s to answer.
//!
//! Invariant: a silence (no answer in time, a failed connection, 502/503/504) marks every trusted
//! kind `Stale` at once; any other answer, 403 included, never does.

use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::retry::{self, Backoff};

/// How often the API server is asked.
pub const PERIOD: Duration = Duration::from_millis(500);
/// How long an answer may take before the API server is taken for silent.
pub const TIMEOUT: Duration = Duration::from_secs(1);
/// What is asked: cheap, allowed to every identity, exempt from queuing (see the module docs).
pub const PATH: &str = "/livez?exclude=etcd";

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Nothing, or not the whole answer, within [`TIMEOUT`].
    #[error("no answer to GET {PATH} within {0:?}")]
    Timeout(Duration),
    /// The request could not be sent or its answer read (connection refused or reset).
    #[error("GET {PATH} failed: {0}")]
    Request(#[source] kube::Error),
    /// A gateway answered that the API server behind it does not.
    #[error("GET {PATH} was answered {0} (a gateway without an API server behind it)")]
    Gateway(StatusCode),
    /// The request could not be built (never with a constant path).
    #[error("GET {PATH} cannot be built: {0}")]
    Build(#[source] http::Error),
}

/// The probe task: asks the API server every [`PERIOD`], reports each failure.
pub(super) struct Probe {
    client: kube::Client,
    silence: watch::Sender<String>,
    answers: watch::Sender<u64>,
}

/// What a watch loop hears of the probe: each failure, with its reason, and each time the API
/// server answers again after failures.
#[derive(Clone, Debug)]
pub(super) struct Silence {
    reports: watch::Receiver<String>,
    answers: watch::Receiver<u64>,
}

/// A probe through `client`, and the handle the watch loops listen on.
pub(super) fn probe(client: kube::Client) -> (Probe, Silence) {
    let (silence, reports) = watch::channel(String::new());
    let (answers_tx, answers) = watch::channel(0);
    (
        Probe {
            client,
            silence,
            answers: answers_tx,
        },
        Silence { reports, answers },
    )
}

impl Probe {
    /// Runs until dropped. While connections to the API server fail (it is down, not frozen),
    /// the probe goes on every [`PERIOD`] for [`retry::GRACE`], then backs off to at most 5 s
    /// ([`crate::retry`]); the first answer after failures wakes the watch loops.
    pub async fn run(self) {
        let mut backoff = retry::probe(PERIOD);
        let mut failing = false;
        loop {
            let started = tokio::time::Instant::now();
            let wait = match check(&self.client).await {
                Ok(()) => {
                    if failing {
                        info!("the API server answers the liveness probe again");
                        self.answers.send_modify(|n| *n += 1);
                    }
                    failing = false;
                    backoff.reset();
                    PERIOD
                }
                Err(error) => {
                    let described = retry::error_chain(&error);
                    if failing {
                        debug!(error = %described, "the API server is still silent");
                    } else {
                        warn!(
                            error = %described,
                            "the API server did not answer the liveness probe: the lock index is stale until a new list and watch"
                        );
                    }
                    failing = true;
                    let wait = if matches!(error, ProbeError::Request(_)) {
                        backoff.next().unwrap_or(retry::MAX_WAIT)
                    } else {
                        PERIOD
                    };
                    self.silence
                        .send_replace(format!("liveness probe: {error}"));
                    wait
                }
            };
            tokio::time::sleep_until(started + wait).await;
        }
    }
}

/// One probe: `Ok` when the API server answered in time (whatever it said, gateways apart).
pub(super) async fn check(client: &kube::Client) -> Result<(), ProbeError> {
    let ask = async {
        let request = http::Request::get(PATH)
            .body(kube::client::Body::from(Vec::new()))
            .map_err(ProbeError::Build)?;
        let response = client.send(request).await.map_err(ProbeError::Request)?;
        let status = response.status();
        // Read to the end, so the connection goes back to the pool for the next probe.
        response
            .into_body()
            .collect()
            .await
            .map_err(ProbeError::Request)?;
        match status {
            StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT => Err(ProbeError::Gateway(status)),
            _ => Ok(()),
        }
    };
    tokio::time::timeout(TIMEOUT, ask)
        .await
        .unwrap_or(Err(ProbeError::Timeout(TIMEOUT)))
}

impl Silence {
    /// A handle that never reports (no probe runs).
    #[cfg(test)]
    pub fn never() -> Silence {
        Silence::manual().1
    }

    /// A handle and the sender that reports to it, for tests of the watch loop.
    #[cfg(test)]
    pub fn manual() -> (watch::Sender<String>, Silence) {
        let (silence, reports) = watch::channel(String::new());
        let (_, answers) = watch::channel(0);
        (silence, Silence { reports, answers })
    }

    /// Sleeps for `wait`, or less if the API server answers the probe again meanwhile (after
    /// failures): a loop backed off while the server was down retries as soon as it is back.
    pub async fn back_off(&mut self, wait: Duration) {
        self.answers.borrow_and_update();
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            Ok(()) = self.answers.changed() => {}
        }
    }

    /// The API server has just answered (a watch was accepted): failures reported until now are
    /// about an earlier silence.
    pub fn heard(&mut self) {
        self.reports.borrow_and_update();
    }

    /// Waits for a failure reported since [`Silence::heard`] (returned at once if there is one);
    /// returns its reason. Never returns when no probe runs.
    pub async fn reported(&mut self) -> String {
        if self.reports.changed().await.is_err() {
            return std::future::pending().await;
        }
        self.reports.borrow_and_update().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A client to a server on 127.0.0.1 that answers each connection with `answer` (or, when
    /// `None`, accepts and never answers, as a frozen process does); the requests it read.
    async fn server(
        answer: Option<String>,
    ) -> (kube::Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                let tx = tx.clone();
                let Some(answer) = answer.clone() else {
                    held.push(stream);
                    continue;
                };
                tokio::spawn(async move {
                    let mut buf = vec![0; 4096];
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                    let _ = stream.write_all(answer.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        let config = kube::Config::new(url.parse().expect("url"));
        (kube::Client::try_from(config).expect("client"), rx)
    }

    fn reply(status: &str) -> String {
        format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
    }

    #[tokio::test]
    async fn any_answer_but_a_gateway_error_proves_life() {
        for (status, alive) in [
            ("200 OK", true),
            ("403 Forbidden", true),
            ("500 Internal Server Error", true),
            ("502 Bad Gateway", false),
            ("503 Service Unavailable", false),
            ("504 Gateway Timeout", false),
        ] {
            let (client, mut requests) = server(Some(reply(status))).await;
            let result = check(&client).await;
            assert_eq!(result.is_ok(), alive, "{status}: {result:?}");
            // kube's client retries a 503 and a 504 itself: those end in the timeout.
            if let Err(error) = result {
                assert!(
                    matches!(error, ProbeError::Gateway(_) | ProbeError::Timeout(_)),
                    "{status}: {error}"
                );
            }
            let request = requests.recv().await.expect("a request");
            assert!(
                request.starts_with(&format!("GET {PATH} HTTP/1.1")),
                "{request}"
            );
        }
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_failure() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        drop(listener);
        let client =
            kube::Client::try_from(kube::Config::new(url.parse().expect("url"))).expect("client");
        let error = check(&client).await.expect_err("refused");
        assert!(matches!(error, ProbeError::Request(_)), "{error}");
    }

    #[tokio::test]
    async fn the_loop_reports_each_failure_to_the_watches() {
        let (client, _) = server(None).await;
        let (probe, mut silence) = probe(client);
        let task = tokio::spawn(probe.run());
        silence.heard();
        let reason = tokio::time::timeout(Duration::from_secs(10), silence.reported())
            .await
            .expect("reported");
        assert!(
            reason.starts_with("liveness probe: no answer to GET"),
            "{reason}"
        );
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_before_the_server_answered_again_is_forgotten() {
        let (report, mut silence) = Silence::manual();
        report.send_replace("liveness probe: first".into());
        silence.heard();
        let waited = tokio::time::timeout(Duration::from_secs(3600), silence.reported()).await;
        assert!(waited.is_err(), "reported before the watch was answered");
        report.send_replace("liveness probe: second".into());
        let reason = tokio::time::timeout(Duration::from_secs(1), silence.reported()).await;
        assert_eq!(reason.as_deref(), Ok("liveness probe: second"));
    }
}
