//! The two writers that report what this instance enforces, started and stopped together: lock
//! status ([`crate::status`]) and refusal events ([`crate::events`]), both reading the admission
//! path's lock index ([`status::view`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::events::{self, EventSink};
use crate::locks::index::LockIndex;
use crate::metrics::EnforcementMetrics;
use crate::registration::Registered;
use crate::status;

/// Refusals queued for events at most; more are dropped (and counted) until the writer catches up.
const EVENT_QUEUE: usize = 4096;

pub struct Reporting {
    /// The admission path's end of the event queue.
    pub events: EventSink,
    stop: CancellationToken,
    /// The two writers, the lock feed and the namespace watch: aborted when dropped.
    tasks: JoinSet<()>,
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
        let mut tasks = JoinSet::new();
        let (snapshots, feed) = status::view::follow(index);
        tasks.spawn(feed);
        // The namespaces' labels matter only under a configuration this instance keeps: only
        // there can it read the operator's requirements.
        let namespaces = registered.as_ref().map(|registered| {
            let (rx, run) = status::namespaces::follow(client.clone(), registered.clone());
            tasks.spawn(run);
            rx
        });
        let (events, queue) = EventSink::channel(EVENT_QUEUE, metrics.clone());
        let stop = CancellationToken::new();
        tasks.spawn(events::run(
            client.clone(),
            instance.clone(),
            events::MIN_INTERVAL,
            queue,
            snapshots.clone(),
            metrics.clone(),
        ));
        tasks.spawn(status::writer::run(
            client,
            instance,
            snapshots,
            registered,
            namespaces,
            metrics,
            stop.clone().cancelled_owned(),
        ));
        Reporting {
            events,
            stop,
            tasks,
        }
    }

    /// Withdraws this instance from the status of the locks and writes the pending events,
    /// within `grace`; the rest is abandoned.
    pub async fn stop(mut self, grace: Duration) {
        self.stop.cancel();
        // The queue closes when the last sink (the reviewer's) is gone; the feed and the
        // namespace watch end with the writers, their only readers.
        drop(self.events);
        let work = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(grace, work).await.is_err() {
            warn!(
                ?grace,
                "lock status and events not fully written at shutdown"
            );
        }
    }
}
