//! Bytes in as the body of `POST /validate`: `review::parse`, then, when it parses, the whole
//! review (plan, lock lookup, decision, response) against a few static locks.
//!
//! Besides "no panic", it checks what must hold for every body: `parse` gives what serde_json
//! alone gives, `review` fails exactly when `parse` does, and an answer carries the request's
//! uid in the request's apiVersion.
#![no_main]

use std::sync::{Arc, LazyLock};

use kube_object_lock::admission::Reviewer;
use kube_object_lock::admission::review;
use kube_object_lock::api::LockSpec;
use kube_object_lock::locks::{LockRef, StaticSource};
use kube_object_lock::settings::Settings;
use libfuzzer_sys::fuzz_target;

struct Harness {
    runtime: tokio::runtime::Runtime,
    reviewer: Reviewer,
}

static HARNESS: LazyLock<Harness> = LazyLock::new(|| {
    // The names the seed corpus (tests/fixtures) uses, locked and not.
    let locks = vec![
        LockRef::lock("demo-015226", "locked-a", LockSpec::default()),
        LockRef::lock("lock-demo", "web", LockSpec::default()),
        LockRef::lock("lock-demo", "evict-me", LockSpec::default()),
        LockRef::lock("lock-doomed", "doomed-cm", LockSpec::default()),
        LockRef::cluster_lock("lock-demo-reader", LockSpec::default()),
        LockRef::cluster_lock("lock-demo", LockSpec::default()),
    ];
    Harness {
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime"),
        reviewer: Reviewer::new(
            Arc::new(StaticSource::new(locks)),
            Settings::default().review_policy(),
        ),
    }
});

fuzz_target!(|data: &[u8]| {
    let harness = &*HARNESS;
    let parsed = review::parse(data);
    assert_eq!(
        parsed,
        review::parse_with_serde_json(data),
        "the fast parse reads what serde_json reads"
    );
    let answer = harness
        .runtime
        .block_on(harness.reviewer.review(data, None));
    match (parsed, answer) {
        (Ok(parsed), Ok(answer)) => {
            let response = serde_json::to_value(&answer.review).expect("the answer serializes");
            assert_eq!(response["apiVersion"], parsed.api_version);
            assert_eq!(response["kind"], "AdmissionReview");
            assert_eq!(response["response"]["uid"], parsed.request.uid.as_ref());
            assert!(response["response"]["allowed"].is_boolean());
        }
        (Err(p), Err(r)) => assert_eq!(p, r, "parse and review fail alike"),
        (Ok(_), Err(e)) => panic!("parsed, yet review failed: {e}"),
        (Err(e), Ok(_)) => panic!("review answered what parse refused: {e}"),
    }
});
