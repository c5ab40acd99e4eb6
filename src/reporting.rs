//! The two writers that report what this instance enforces, started and stopped together: lock
//! status ([`crate::status`]) and refusal events ([`crate::events`]), both reading the admission
//! path's lock index ([`status::view`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::warn;

use crate::events::{self, EventSink};
use crate::locks::index::LockIndex;
use crate::metrics::EnforcementMetrics;
use crate::registration::Registered;
use crate::status::{self, writer::DecisionInputs};

pub struct Reporting {
    /// The admission path's end of the event queue.
    pub events: EventSink,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    status: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
    /// The lock feed and the namespace watch: aborted when dropped.
    _background: tokio::task::JoinSet<()>,
}

impl Reporting {
    /// `registered`: what the narrowed configuration names, when this instance keeps one.
    pub fn start(
        client: kube::Client,
        instance: String,
        metrics: EnforcementMetrics,
        index: Arc<LockIndex>,
        registered: Option<watch::Receiver<Registered>>,
    ) -> Reporting {
        let mut background = tokio::task::JoinSet::new();
        let (snapshots, feed) = status::view::follow(index);
        background.spawn(feed);
        // The namespaces' labels matter only under a configuration this instance keeps: only
        // there can it read the operator's requirements.
        let namespaces = registered.as_ref().map(|registered| {
            let (rx, run) = status::namespaces::follow(client.clone(), registered.clone());
            background.spawn(run);
            rx
        });
        let inputs = DecisionInputs {
            registered,
            namespaces,
        };
        let (events, queue) = EventSink::channel(EVENT_QUEUE, metrics.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let writer = tokio::spawn(events::run(
            client.clone(),
            events::WriterConfig::new(instance.clone()),
            queue,
            snapshots.clone(),
            metrics.clone(),
        ));
        let status = tokio::spawn(status::writer::run(
            client,
            instance,
            snapshots,
            inputs,
            metrics,
            async {
                let _ = stopped.await;
            },
        ));
        Reporting {
            events,
            stop: Some(stop),
            status,
            writer,
            _background: background,
        }
    }

    /// Withdraws this instance from the status of the locks and writes the pending events,
    /// within `grace`; the rest is abandoned.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // The queue closes when the last sink (the reviewer's) is gone.
        drop(self.events);
        let work = async {
            let _ = (&mut self.status).await;
            let _ = (&mut self.writer).await;
        };
        if tokio::time::timeout(grace, work).await.is_err() {
            warn!(
                ?grace,
                "lock status and events not fully written at shutdown"
            );
        }
        self.status.abort();
        self.writer.abort();
    }
}

/// Refusals queued for events at most; more are dropped (and counted) until the writer catches up.
const EVENT_QUEUE: usize = 4096;
