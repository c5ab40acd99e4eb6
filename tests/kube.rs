//! The Kubernetes lock source against a fake API server speaking the real REST and watch wire
//! format to a real `kube::Client`, with the real webhook in front, over real HTTPS.
//!
//! Staleness cases follow one pattern: a Lock created at time T must be enforced by every
//! admission after T + `kube.stale_after` + `cache.ttl` (when a TTL is set) that the index cannot
//! answer, whatever the watch is going through (refused, cut, delayed, expired), because lookups
//! then fall back to LIST; one the index answers waits for the watch to deliver it. The settings
//! are small and the assertions are about behaviour, never about how fast it happened.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_object_lock::app::Source;
use kube_object_lock::locks::LockSource;
use kube_object_lock::locks::apiserver::{CacheConfig, KubeSource};
use kube_object_lock::locks::index::WatchState;
use kube_object_lock::metrics::Metrics;
use kube_object_lock::settings::Settings;
use serde_json::{Value, json};
use support::fake_apiserver::{FakeApiServer, Fault};
use support::{TestServer, fixture, sample};

const NS: &str = "demo-015226";
/// The LIST path of the fixture namespace's Locks.
const NS_LOCKS: &str = "/apis/objectlock.dev/v1alpha1/namespaces/demo-015226/locks";

/// `kube.stale_after` and `cache.ttl` of the staleness tests.
const BOUND: Duration = Duration::from_millis(400);
const TTL: Duration = Duration::from_millis(300);

struct Setup {
    api: FakeApiServer,
    source: KubeSource,
    server: TestServer,
    ttl: Duration,
    stale_after: Duration,
}

/// A webhook on a fake API server with a long fallback TTL and bound (the watch alone keeps
/// locks current).
async fn setup(ttl: Duration, tune: impl FnOnce(&mut Settings)) -> Setup {
    setup_with(
        FakeApiServer::start().await,
        ttl,
        Duration::from_secs(600),
        tune,
    )
    .await
}

async fn setup_with(
    api: FakeApiServer,
    ttl: Duration,
    stale_after: Duration,
    tune: impl FnOnce(&mut Settings),
) -> Setup {
    support::init();
    let metrics = Arc::new(Metrics::new());
    let source = KubeSource::new(
        api.client(),
        CacheConfig {
            ttl,
            max_namespaces: 1000,
            stale_after,
        },
        metrics.source.clone(),
    );
    let refresh = tokio::spawn(source.watch());
    let server = TestServer::start_full(
        support::Certs::new(),
        Source {
            source: Arc::new(source.clone()),
            refresh: Some(refresh),
            client: None,
        },
        metrics,
        tune,
    )
    .await;
    Setup {
        api,
        source,
        server,
        ttl,
        stale_after,
    }
}

/// A fixture with edits applied to its JSON.
fn edited(fixture_name: &str, edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut review: Value = serde_json::from_slice(&fixture(fixture_name)).expect("fixture json");
    edit(&mut review["request"]);
    serde_json::to_vec(&review).expect("serializes")
}

impl Setup {
    async fn review(&self, fixture_name: &str) -> Value {
        self.review_body(fixture(fixture_name)).await
    }

    async fn review_body(&self, body: Vec<u8>) -> Value {
        self.server.admission_response(body).await
    }

    async fn allowed(&self, fixture_name: &str) -> bool {
        self.review(fixture_name).await["allowed"] == true
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.source.is_ready() {
            assert!(Instant::now() < deadline, "watch never synced");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the Lock watch is in `state`.
    async fn wait_lock_watch(&self, state: WatchState) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self
            .source
            .index()
            .health(kube_object_lock::locks::LockKind::Lock)
            .state
            != state
        {
            assert!(
                Instant::now() < deadline,
                "the Lock watch never became {state:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Polls until the review's `allowed` becomes `want`; returns how long that took.
    async fn until_allowed_is(&self, fixture_name: &str, want: bool) -> Duration {
        self.until_body_allowed_is(|| fixture(fixture_name), want, "")
            .await
            .1
    }

    /// Polls until the answer to `body()` has `allowed == want` and mentions `needle`.
    async fn until_body_allowed_is(
        &self,
        body: impl Fn() -> Vec<u8>,
        want: bool,
        needle: &str,
    ) -> (Value, Duration) {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(10);
        loop {
            let answer = self.review_body(body()).await;
            if answer["allowed"] == want && answer.to_string().contains(needle) {
                return (answer, started.elapsed());
            }
            assert!(
                Instant::now() < deadline,
                "never allowed={want} with {needle:?}: {answer}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Creates `locked-a` now (time T) and checks that the DELETE of its object is refused
    /// because of it by every admission after T + stale_after + ttl that the index cannot answer
    /// (see [`Setup::until_bound_gives`]).
    async fn lock_is_enforced_within_the_bound(&self, case: &str) {
        let created = Instant::now();
        self.api
            .create_lock(NS, "locked-a", json!({"reason": case}));
        let answer = self.until_bound_gives(created, false, case).await;
        let message = answer["status"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains(&format!("is locked by Lock {NS}/locked-a: {case}")),
            "{case}: refused by the lock, not by a failed lookup: {message}"
        );
    }

    /// Polls the DELETE of `locked-a`'s object until `allowed == want`, `locked-a` having been
    /// created or deleted at `changed`; returns that answer. From `changed` + stale_after + ttl on,
    /// a lookup that the index cannot answer lists the namespace (a fallback answer is reused for at
    /// most `ttl`, and a watch that has not come back is stale by then), so an earlier answer then
    /// fails the test at once. Only while the index answers may it come later: a live watch
    /// delivers the change when the scheduler lets it, which is waited for (10 s at most).
    async fn until_bound_gives(&self, changed: Instant, want: bool, case: &str) -> Value {
        let bound = changed + self.stale_after + self.ttl;
        let deadline = changed + Duration::from_secs(10);
        loop {
            let indexed_before = self.source.locks_at_hand(NS).is_some();
            let arrived = Instant::now();
            let answer = self.review("configmap-delete-locked.json").await;
            if answer["allowed"] == want {
                println!("{case}: allowed={want} after {:?}", changed.elapsed());
                return answer;
            }
            let indexed = indexed_before || self.source.locks_at_hand(NS).is_some();
            assert!(
                arrived < bound || indexed,
                "{case}: past the bound, a lookup that listed still answered {answer}"
            );
            assert!(
                Instant::now() < deadline,
                "{case}: never allowed={want}: {answer}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// WATCH requests so far.
    fn watches(&self) -> usize {
        let log = self.api.request_log();
        log.iter().filter(|r| r.contains("watch=")).count()
    }

    /// Lookups made by the fallback for the fixture namespace so far.
    fn namespace_lists(&self) -> usize {
        self.api.list_calls(NS_LOCKS)
    }
}

#[tokio::test]
async fn with_the_watch_live_lookups_make_no_api_requests() {
    let setup = setup(Duration::from_secs(600), |_| {}).await;
    setup
        .api
        .create_lock(NS, "locked-a", json!({"reason": "VM snapshot in progress"}));
    for i in (0..200).step_by(7) {
        setup
            .api
            .create_lock(&format!("ns-{i}"), "locked-a", json!({}));
    }
    setup.wait_ready().await;
    let watch_lists = setup.api.list_calls("");
    let client = setup.server.http1();
    let url = setup.server.url("/validate");
    let burst = (0..32).map(|i| {
        let name = if i % 2 == 0 {
            "configmap-delete-locked.json"
        } else {
            "configmap-delete-unlocked.json"
        };
        client.post_json(&url, fixture(name))
    });
    let replies = futures::future::join_all(burst).await;
    let denied = replies
        .iter()
        .filter(|r| r.json()["response"]["allowed"] == false)
        .count();
    assert_eq!(denied, 16);
    for name in [
        "configmap-update-put.json",
        "configmap-update-merge-patch.json",
        "configmap-deletecollection-item.json",
        "widget-update.json",
        "widget-delete.json",
    ] {
        for _ in 0..20 {
            setup.review(name).await;
        }
    }
    // 200 namespaces, every seventh locked: the index knows both kinds of answer.
    for i in 0..200 {
        let body = String::from_utf8(fixture("configmap-delete-locked.json"))
            .expect("utf-8")
            .replace(NS, &format!("ns-{i}"));
        let answer = setup.review_body(body.into_bytes()).await;
        assert_eq!(answer["allowed"], i % 7 != 0, "ns-{i}: {answer}");
    }
    assert!(setup.allowed("configmap-create.json").await);
    assert!(setup.allowed("deployment-update.json").await);
    assert!(setup.allowed("clusterrole-update.json").await);
    // What the index has at hand is what a lookup answers, locks or none.
    for ns in [NS, "ns-0", "ns-1", "ns-7", ""] {
        let at_hand = setup.source.locks_at_hand(ns).expect("the index answers");
        let looked_up = setup.source.locks(ns).await.expect("looked up");
        assert_eq!(at_hand, looked_up, "{ns:?}");
        assert_eq!(
            at_hand.is_empty(),
            !matches!(ns, NS | "ns-0" | "ns-7"),
            "{ns:?}"
        );
    }
    let lookups = setup.api.list_calls("") - watch_lists;
    println!("332 admissions over 201 namespaces with the watch live: {lookups} LIST call(s)");
    assert_eq!(lookups, 0, "{:?}", setup.api.request_log());
    assert_eq!(setup.source.metrics().cache_loads.get(), 0);
}

#[tokio::test]
async fn watch_forbidden_falls_back_to_list_and_enforces_within_the_bound() {
    let api = FakeApiServer::start().await;
    // An identity that may list but not watch.
    api.set_watch_fault(Some(Fault::Status(403)));
    let setup = setup_with(api, TTL, BOUND, |_| {}).await;
    setup.wait_lock_watch(WatchState::Stale).await;
    // A cached "no lock" from the fallback...
    assert!(setup.allowed("configmap-delete-locked.json").await);
    assert!(setup.namespace_lists() >= 1, "the fallback LISTed");
    // ...does not outlive the TTL.
    setup
        .lock_is_enforced_within_the_bound("watch forbidden")
        .await;
    let ready = setup.server.http1().get(&setup.server.url("/readyz")).await;
    assert_eq!(ready.status, 503);
    let why = String::from_utf8_lossy(&ready.body).to_string();
    assert!(
        why.contains("Lock watch stale") && why.contains("cannot watch"),
        "{why}"
    );
    let text = setup.server.scrape().await;
    assert_eq!(
        sample(
            &text,
            "kube_object_lock_lock_source_mode{kind=\"Lock\",mode=\"fallback\"}"
        ),
        1.0,
        "{text}"
    );
    assert!(
        sample(
            &text,
            "kube_object_lock_lock_source_mode_since_timestamp_seconds{kind=\"Lock\"}"
        ) > 1.7e9
    );
    // Watch allowed again: live, and lookups stop LISTing.
    setup.api.set_watch_fault(None);
    setup.wait_ready().await;
    let lists = setup.namespace_lists();
    for _ in 0..10 {
        assert!(!setup.allowed("configmap-delete-locked.json").await);
    }
    assert_eq!(setup.namespace_lists(), lists);
    let ready = setup.server.http1().get(&setup.server.url("/readyz")).await;
    assert_eq!(ready.status, 200);
}

#[tokio::test]
async fn while_the_watch_fails_every_retry_lists_so_the_index_holds_new_locks() {
    // The narrowed registration follows the index, so the index must learn of a new Lock even
    // when no watch can run; a resume that never lists (here for up to 600 s) would not.
    let api = FakeApiServer::start().await;
    api.set_watch_fault(Some(Fault::Status(403)));
    let setup = setup_with(api, TTL, Duration::from_secs(600), |_| {}).await;
    setup.wait_lock_watch(WatchState::Stale).await;
    setup.api.create_lock(NS, "locked-a", json!({}));
    let holds = || {
        setup
            .source
            .index()
            .snapshot()
            .sets
            .get(NS)
            .is_some_and(|set| set.get("locked-a").is_some())
    };
    support::until(
        "the index lists the new Lock while its watch fails",
        holds,
        |held| *held,
    )
    .await;
    assert_eq!(
        setup
            .source
            .index()
            .health(kube_object_lock::locks::LockKind::Lock)
            .state,
        WatchState::Stale,
        "listed, but not live: lookups still ask the API server"
    );
}

#[tokio::test]
async fn while_stale_an_acknowledged_lock_is_seen_by_the_next_admission() {
    // With the default cache.ttl, a fallback LIST is never reused by a later lookup, so there is
    // no window in which a stored Lock is missed (an API server restart, before the watch is back).
    let api = FakeApiServer::start().await;
    api.set_watch_fault(Some(Fault::Status(403)));
    let setup = setup_with(api, Settings::default().cache.ttl, BOUND, |_| {}).await;
    setup.wait_lock_watch(WatchState::Stale).await;
    for round in 0..5 {
        assert!(
            setup.allowed("configmap-delete-locked.json").await,
            "round {round}: not locked yet"
        );
        let lists = setup.namespace_lists();
        setup
            .api
            .create_lock(NS, "locked-a", json!({"reason": "no window"}));
        let answer = setup.review("configmap-delete-locked.json").await;
        assert_eq!(answer["allowed"], false, "round {round}: {answer}");
        assert!(setup.namespace_lists() > lists, "round {round}: read again");
        setup.api.delete_lock(NS, "locked-a");
        assert!(
            setup.allowed("configmap-delete-locked.json").await,
            "round {round}: released by the next admission"
        );
    }
}

#[tokio::test]
async fn a_watch_error_makes_the_index_stale_at_once() {
    // The bound is far away: only the error itself can make lookups LIST.
    let setup = setup_with(
        FakeApiServer::start().await,
        TTL,
        Duration::from_secs(600),
        |_| {},
    )
    .await;
    setup.wait_ready().await;
    setup.api.set_watch_fault(Some(Fault::Status(403)));
    setup.api.drop_watches();
    setup.wait_lock_watch(WatchState::Stale).await;
    // Nothing is at hand any more: every lookup asks the API server.
    assert!(setup.source.locks_at_hand(NS).is_none());
    setup
        .api
        .create_lock(NS, "locked-a", json!({"reason": "after the error"}));
    // No lookup has been cached here, and the watch stays refused: the next admission lists.
    let lists = setup.namespace_lists();
    let answer = setup.review("configmap-delete-locked.json").await;
    assert_eq!(answer["allowed"], false, "{answer}");
    assert!(setup.namespace_lists() > lists, "answered by a LIST");
}

#[tokio::test]
async fn etcd_compaction_enforces_within_the_bound() {
    let api = FakeApiServer::start().await;
    // Some history, so that the watch resumes from a real resourceVersion.
    api.create_lock("elsewhere", "other", json!({}));
    let setup = setup_with(api, TTL, BOUND, |_| {}).await;
    setup.wait_ready().await;
    assert!(setup.allowed("configmap-delete-locked.json").await);
    let lists = setup.api.list_calls("/v1alpha1/locks?");
    setup.api.compact();
    setup.api.drop_watches();
    setup
        .lock_is_enforced_within_the_bound("etcd compaction")
        .await;
    setup.wait_lock_watch(WatchState::Live).await;
    assert!(
        setup.api.list_calls("/v1alpha1/locks?") > lists,
        "the 410 made the watch list again: {:?}",
        setup.api.request_log()
    );
}

#[tokio::test]
async fn a_proxy_cutting_watches_does_not_stop_enforcement() {
    let setup = setup_with(FakeApiServer::start().await, TTL, BOUND, |_| {}).await;
    setup.wait_ready().await;
    let watches = setup.watches();
    setup
        .api
        .set_watch_fault(Some(Fault::Cut(Duration::from_millis(50))));
    setup.api.drop_watches();
    assert!(setup.allowed("configmap-delete-locked.json").await);
    setup.lock_is_enforced_within_the_bound("proxy cut").await;
    let deleted = Instant::now();
    setup.api.delete_lock(NS, "locked-a");
    setup
        .until_bound_gives(deleted, true, "proxy cut, released too")
        .await;
    support::until(
        "each cut watch was resumed",
        || setup.watches(),
        |calls| *calls > watches + 2,
    )
    .await;
}

#[tokio::test]
async fn a_watch_that_does_not_come_back_goes_stale_after_the_bound() {
    let setup = setup_with(FakeApiServer::start().await, TTL, BOUND, |_| {}).await;
    setup.wait_ready().await;
    assert!(setup.allowed("configmap-delete-locked.json").await);
    // The watch ends cleanly and its resume hangs: no error, only the bound tells.
    setup
        .api
        .set_watch_fault(Some(Fault::Delay(Duration::from_secs(30))));
    setup.api.drop_watches();
    setup.wait_lock_watch(WatchState::Stale).await;
    setup
        .lock_is_enforced_within_the_bound("watch delayed")
        .await;
    assert!(setup.namespace_lists() >= 1, "the fallback LISTed");
    let ready = setup.server.http1().get(&setup.server.url("/readyz")).await;
    assert_eq!(ready.status, 503);
}

#[tokio::test]
async fn a_silent_api_server_makes_the_index_stale_and_it_recovers() {
    use kube_object_lock::locks::LockKind;
    // The bound is far away and nothing will error or end: only the liveness probe can tell.
    let setup = setup(Duration::ZERO, |s| {
        s.kube.lookup_timeout = Duration::from_millis(300)
    })
    .await;
    setup.wait_ready().await;
    assert!(setup.allowed("configmap-delete-unlocked.json").await);

    // What the probe costs while all is well: its requests, and nothing else.
    let before = setup.api.request_log().len();
    let quiet = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let requests: Vec<String> = setup.api.request_log()[before..].to_vec();
    let probes = requests
        .iter()
        .filter(|r| r.starts_with("GET /livez"))
        .count();
    println!(
        "idle for {:?}: {probes} probe(s), {} other request(s)",
        quiet.elapsed(),
        requests.len() - probes
    );
    assert!(probes >= 1, "the probe asks: {requests:?}");
    assert_eq!(probes, requests.len(), "only the probe asks: {requests:?}");

    // Frozen: connections stay open, nothing is answered, nothing ends.
    setup.api.freeze(true);
    let frozen = Instant::now();
    let kinds = [LockKind::Lock, LockKind::ClusterLock];
    let health = support::until(
        "both kinds stale",
        || kinds.map(|kind| setup.source.index().health(kind)),
        |health| health.iter().all(|h| h.state == WatchState::Stale),
    )
    .await;
    println!("frozen -> stale in {:?}", frozen.elapsed());
    for h in &health {
        let reason = h.reason.as_deref().unwrap_or("");
        assert!(reason.contains("liveness probe"), "{reason}");
    }
    assert!(setup.source.locks_at_hand(NS).is_none());
    // A write in a namespace without Locks: not allowed from the index, but refused because the
    // lock state cannot be read (on_lookup_error=deny).
    let answer = setup.review("configmap-delete-unlocked.json").await;
    assert_eq!(answer["allowed"], false, "{answer}");
    assert_eq!(answer["status"]["code"], 503, "{answer}");
    let message = answer["status"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("lock state could not be read") && message.contains("no answer within"),
        "{message}"
    );
    let ready = setup.server.http1().get(&setup.server.url("/readyz")).await;
    assert_eq!(ready.status, 503);
    // Meanwhile a Lock is created through another API server.
    setup
        .api
        .create_lock(NS, "locked-a", json!({"reason": "while frozen"}));

    // Answering again: a fresh list and watch, and lookups are answered from the index.
    setup.api.freeze(false);
    let thawed = Instant::now();
    support::until(
        "both kinds live again",
        || kinds.map(|kind| setup.source.index().health(kind).state),
        |states| states.iter().all(|s| *s == WatchState::Live),
    )
    .await;
    println!("thawed -> live in {:?}", thawed.elapsed());
    let at_hand = setup.source.locks_at_hand(NS).expect("the index answers");
    assert!(at_hand.get("locked-a").is_some(), "{at_hand:?}");
    let lists = setup.namespace_lists();
    let answer = setup.review("configmap-delete-locked.json").await;
    assert_eq!(answer["allowed"], false, "{answer}");
    let message = answer["status"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(&format!("is locked by Lock {NS}/locked-a: while frozen")),
        "{message}"
    );
    assert!(setup.allowed("configmap-delete-unlocked.json").await);
    assert_eq!(setup.namespace_lists(), lists, "answered from the index");
    let ready = setup.server.http1().get(&setup.server.url("/readyz")).await;
    assert_eq!(ready.status, 200);
}

#[tokio::test]
async fn a_restarted_webhook_enforces_before_and_after_its_first_sync() {
    let api = FakeApiServer::start().await;
    api.create_lock(NS, "locked-b", json!({}));
    // The watch is slow to start: lookups LIST meanwhile.
    api.set_watch_fault(Some(Fault::Delay(Duration::from_secs(2))));
    let setup = setup_with(api, TTL, BOUND, |_| {}).await;
    assert!(!setup.source.is_ready());
    setup
        .lock_is_enforced_within_the_bound("webhook restart")
        .await;
    setup.api.set_watch_fault(None);
    setup.wait_ready().await;
    let lists = setup.namespace_lists();
    assert!(!setup.allowed("configmap-delete-locked.json").await);
    assert_eq!(
        setup.namespace_lists(),
        lists,
        "answered from the index once synced"
    );
}

#[tokio::test]
async fn an_unreadable_lock_fails_closed_for_its_own_name_only() {
    for watch in [true, false] {
        let api = FakeApiServer::start().await;
        if !watch {
            api.set_watch_fault(Some(Fault::Status(403)));
        }
        let setup = setup_with(
            api,
            Duration::from_millis(100),
            Duration::from_secs(600),
            |_| {},
        )
        .await;
        if watch {
            setup.wait_ready().await;
        } else {
            setup.wait_lock_watch(WatchState::Stale).await;
        }
        // A value from a newer version: this one cannot read it, and enforces UPDATE and DELETE.
        setup.api.create_lock(
            NS,
            "locked-a",
            json!({"mode": "Audit", "reason": "upgrade test"}),
        );
        setup
            .api
            .create_lock(NS, "locked-b", json!({"operations": ["DELETE"]}));
        let (answer, _) = setup
            .until_body_allowed_is(|| fixture("configmap-update-put.json"), false, "")
            .await;
        assert_eq!(answer["status"]["code"], 403, "watch={watch}: {answer}");
        let message = answer["status"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("Lock demo-015226/locked-a: upgrade test"),
            "{message}"
        );
        let warning = answer["warnings"][0].as_str().unwrap_or("");
        assert!(
            warning.contains("Lock demo-015226/locked-a: unreadable spec")
                && warning.contains("spec.mode"),
            "watch={watch}: {warning}"
        );
        // The rest of the namespace works as usual: an unlocked object, and the other Lock
        // (DELETE only) lets its object be updated.
        assert!(
            setup.allowed("configmap-delete-unlocked.json").await,
            "watch={watch}"
        );
        let update_b = edited("configmap-update-put.json", |r| {
            r["name"] = json!("locked-b");
        });
        assert_eq!(
            setup.review_body(update_b).await["allowed"],
            true,
            "watch={watch}"
        );
        let delete_b = edited("configmap-delete-locked.json", |r| {
            r["name"] = json!("locked-b");
        });
        assert_eq!(
            setup.review_body(delete_b).await["allowed"],
            false,
            "watch={watch}"
        );
        if watch {
            let series = "kube_object_lock_unparseable_locks{kind=\"Lock\",namespace=\"demo-015226\",name=\"locked-a\"}";
            assert_eq!(sample(&setup.server.scrape().await, series), 1.0);
            // Fixed: the metric goes, and the lock means what it says again.
            setup
                .api
                .create_lock(NS, "locked-a", json!({"operations": ["DELETE"]}));
            setup
                .until_allowed_is("configmap-update-put.json", true)
                .await;
            assert!(!setup.server.scrape().await.contains(series));
        }
    }
}

#[tokio::test]
async fn a_dropped_or_expired_watch_recovers() {
    let setup = setup(Duration::from_secs(600), |_| {}).await;
    setup.wait_ready().await;
    assert!(setup.allowed("configmap-delete-locked.json").await);
    let watches = setup.watches();
    setup.api.drop_watches();
    setup.api.create_lock(NS, "locked-a", json!({}));
    setup
        .until_allowed_is("configmap-delete-locked.json", false)
        .await;
    assert!(setup.watches() > watches, "the watch was re-established");

    // History compacted while the watch is down: the watcher gets 410 Gone and re-lists.
    let restarts = || {
        setup
            .source
            .metrics()
            .watch_restarts
            .get_or_create(&kube_object_lock::metrics::KindLabels { kind: "Lock" })
            .get()
    };
    let errors = restarts();
    setup.api.compact();
    setup.api.drop_watches();
    setup.api.delete_lock(NS, "locked-a");
    setup
        .until_allowed_is("configmap-delete-locked.json", true)
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while restarts() == errors {
        assert!(Instant::now() < deadline, "the 410 was never seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // After the re-list, new locks are still enforced at once.
    setup.api.create_lock(NS, "locked-a", json!({}));
    setup
        .until_allowed_is("configmap-delete-locked.json", false)
        .await;
}

#[tokio::test]
async fn api_outage_gives_the_configured_decision_within_the_lookup_timeout() {
    let timeout = Duration::from_millis(300);
    let setup = setup(Duration::from_millis(50), |s| {
        s.kube.lookup_timeout = timeout
    })
    .await;
    setup.api.create_lock(NS, "locked-a", json!({}));
    setup.wait_ready().await;
    // Lookups reach the API server only while the index is stale.
    setup.api.set_watch_fault(Some(Fault::Status(403)));
    setup.api.drop_watches();
    setup.wait_lock_watch(WatchState::Stale).await;

    for (fault, needle, reason, outcome) in [
        (
            Fault::Delay(Duration::from_secs(5)),
            "no answer within 300ms",
            "timeout",
            None,
        ),
        (
            Fault::Status(500),
            "500 (InternalError)",
            "api",
            Some("server_error"),
        ),
        (
            Fault::Status(403),
            "grant it get, list and watch on locks and clusterlocks",
            "forbidden",
            Some("forbidden"),
        ),
    ] {
        let lookup_errors = format!(
            "kube_object_lock_lookup_errors_total{{reason=\"{reason}\",decision=\"deny\"}}"
        );
        let before = sample(&setup.server.scrape().await, &lookup_errors);
        setup.api.set_fault(Some(fault.clone()));
        // The cause: the cached entry's TTL passes, so the next lookup lists (counted below).
        tokio::time::sleep(setup.ttl + Duration::from_millis(10)).await;
        let started = Instant::now();
        let answer = setup.review("configmap-delete-unlocked.json").await;
        let took = started.elapsed();
        println!("{fault:?}: answered in {took:?} (lookup timeout {timeout:?})");
        assert_eq!(answer["allowed"], false, "{fault:?}: deny by default");
        assert_eq!(answer["status"]["code"], 503);
        let message = answer["status"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("lock state could not be read"),
            "{message}"
        );
        assert!(message.contains(needle), "{fault:?}: {message}");
        assert!(answer["auditAnnotations"]["lookup-error"].is_string());
        let scraped = setup.server.scrape().await;
        assert_eq!(
            sample(&scraped, &lookup_errors),
            before + 1.0,
            "{fault:?} counted"
        );
        if let Some(outcome) = outcome {
            let series = format!(
                "kube_object_lock_api_requests_total{{verb=\"list\",resource=\"locks\",outcome=\"{outcome}\"}}"
            );
            assert!(sample(&scraped, &series) >= 1.0, "{series} in\n{scraped}");
        }
        assert!(
            sample(
                &scraped,
                "kube_object_lock_admission_requests_total{operation=\"DELETE\",decision=\"error\"}"
            ) >= 1.0
        );
        // A status write is allowed when the locks cannot be read; a CREATE is looked up (a Lock may
        // reserve the name), so it follows on_lookup_error like the others.
        assert!(setup.allowed("pod-status-update.json").await);
        assert!(!setup.allowed("configmap-create.json").await);
        setup.api.set_fault(None);
        assert!(
            setup.allowed("configmap-delete-unlocked.json").await,
            "recovers"
        );
        assert!(
            !setup.allowed("configmap-delete-locked.json").await,
            "recovers"
        );
    }
}

#[tokio::test]
async fn metrics_count_admissions_and_the_watch() {
    let setup = setup(Duration::from_secs(600), |_| {}).await;
    setup.api.create_lock(NS, "locked-a", json!({}));
    setup.api.create_lock("", "lock-demo-reader", json!({}));
    setup.wait_ready().await;
    // One more through the watch itself.
    setup.api.create_lock(NS, "locked-b", json!({}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while setup.source.lock_counts().namespaced < 2 {
        assert!(
            Instant::now() < deadline,
            "the watch never delivered locked-b"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!setup.allowed("configmap-delete-locked.json").await);
    assert!(setup.allowed("configmap-delete-unlocked.json").await);
    assert!(setup.allowed("configmap-create.json").await);
    let text = setup.server.scrape().await;
    for (series, value) in [
        (
            "kube_object_lock_admission_requests_total{operation=\"DELETE\",decision=\"denied\"}",
            1.0,
        ),
        (
            "kube_object_lock_admission_requests_total{operation=\"DELETE\",decision=\"allowed\"}",
            1.0,
        ),
        (
            "kube_object_lock_admission_requests_total{operation=\"CREATE\",decision=\"allowed\"}",
            1.0,
        ),
        ("kube_object_lock_admission_duration_seconds_count", 3.0),
        ("kube_object_lock_cache_loads_total", 0.0),
        ("kube_object_lock_locks{scope=\"namespaced\"}", 2.0),
        ("kube_object_lock_locks{scope=\"cluster\"}", 1.0),
        (
            "kube_object_lock_lock_source_mode{kind=\"Lock\",mode=\"watch\"}",
            1.0,
        ),
        (
            "kube_object_lock_lock_source_mode{kind=\"ClusterLock\",mode=\"fallback\"}",
            0.0,
        ),
    ] {
        assert_eq!(sample(&text, series), value, "{series} in\n{text}");
    }
    assert!(sample(&text, "kube_object_lock_watch_events_total{kind=\"Lock\"}") >= 1.0);
    assert!(
        sample(
            &text,
            "kube_object_lock_certificate_expiry_timestamp_seconds"
        ) > 1.7e9
    );
    // Invalid requests are counted apart.
    let reply = setup
        .server
        .http1()
        .post_json(&setup.server.url("/validate"), b"{}".to_vec())
        .await;
    assert_eq!(reply.status, 400);
    assert_eq!(
        sample(
            &setup.server.scrape().await,
            "kube_object_lock_invalid_requests_total"
        ),
        1.0
    );
    // So is every other 4xx of /validate: a wrong content type, a bad timeout.
    let wrong_type = http::Request::post(setup.server.url("/validate"))
        .header("content-type", "text/plain")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .expect("request");
    assert_eq!(setup.server.http1().send(wrong_type).await.status, 400);
    let bad_timeout = setup
        .server
        .http1()
        .post_json(&setup.server.url("/validate?timeout=soon"), b"{}".to_vec())
        .await;
    assert_eq!(bad_timeout.status, 400);
    assert_eq!(
        sample(
            &setup.server.scrape().await,
            "kube_object_lock_invalid_requests_total"
        ),
        3.0
    );
}

#[tokio::test]
async fn readiness_waits_for_the_first_watch() {
    support::init();
    let api = FakeApiServer::start().await;
    let source = KubeSource::new(
        api.client(),
        CacheConfig {
            ttl: Duration::from_secs(30),
            max_namespaces: 10,
            stale_after: Duration::from_secs(3),
        },
        Default::default(),
    );
    let server = TestServer::start(
        Source {
            source: Arc::new(source.clone()),
            refresh: None,
            client: None,
        },
        |_| {},
    )
    .await;
    let client = server.http1();
    let ready = client.get(&server.url("/readyz")).await;
    assert_eq!(ready.status, 503);
    let why = String::from_utf8_lossy(&ready.body).to_string();
    assert!(why.contains("Lock watch not_synced"), "{why}");
    assert_eq!(client.get(&server.url("/healthz")).await.status, 200);
    // Lookups work before the watch syncs: they LIST.
    api.create_lock(NS, "locked-a", json!({}));
    let reply = client
        .post_json(
            &server.url("/validate"),
            fixture("configmap-delete-locked.json"),
        )
        .await;
    assert_eq!(reply.json()["response"]["allowed"], false);
    let watch = tokio::spawn(source.watch());
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.get(&server.url("/readyz")).await.status != 200 {
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    watch.abort();
}
