//! The renewal schedule under tokio's paused clock: what is written when, what is retried,
//! what is told.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use super::*;

const LEASE: Duration = Duration::from_secs(60);

/// Records each renewal (seconds since the start, `expiresAt`) and answers from a script
/// (`Ok` once the script is spent).
#[derive(Clone, Default)]
struct Fake {
    calls: Rc<RefCell<Vec<(u64, String)>>>,
    script: Rc<RefCell<VecDeque<Result<(), RenewError>>>>,
    start: Option<Instant>,
}

impl Fake {
    fn new(script: Vec<Result<(), RenewError>>) -> Fake {
        Fake {
            script: Rc::new(RefCell::new(script.into())),
            start: Some(Instant::now()),
            ..Fake::default()
        }
    }

    fn calls(&self) -> Vec<(u64, String)> {
        self.calls.borrow().clone()
    }
}

impl Renew for Fake {
    async fn renew(&mut self, expires_at: Timestamp) -> Result<(), RenewError> {
        let start = self.start.expect("started");
        let at = Instant::now().duration_since(start);
        // Whole milliseconds, as seconds when exact.
        let at = if at.subsec_millis() == 0 {
            at.as_secs()
        } else {
            at.as_millis() as u64
        };
        self.calls.borrow_mut().push((at, expires_at.to_string()));
        self.script.borrow_mut().pop_front().unwrap_or(Ok(()))
    }
}

fn clock() -> Clock {
    Clock {
        wall: "2026-01-01T00:00:00Z".parse().expect("time"),
        at: Instant::now(),
    }
}

/// The wall time `seconds` after the clock's anchor.
fn wall(seconds: u64) -> String {
    Timestamp::from_second(1_767_225_600 + seconds as i64)
        .expect("time")
        .to_string()
}

fn failed() -> Result<(), RenewError> {
    Err(RenewError::Failed("HTTP 500".into()))
}

/// Runs `keep` for `seconds` of paused time, the lock created at once; the notices told.
async fn keep_for(fake: &Fake, seconds: u64) -> (Vec<Notice>, Option<String>) {
    let clock = clock();
    let (_tx, rx) = watch::channel(Some(fake.clone()));
    let mut notices = vec![];
    let kept = keep(LEASE, clock, Instant::now() + LEASE, rx, |n| {
        notices.push(n)
    });
    let lost = tokio::select! {
        lost = kept => Some(lost),
        () = tokio::time::sleep(Duration::from_secs(seconds)) => None,
    };
    (notices, lost)
}

#[tokio::test(start_paused = true)]
async fn renewals_failures_and_notices() {
    let failing = |left: u64| Notice::Failing {
        left: Duration::from_secs(left),
        why: "HTTP 500".into(),
    };
    let lapsed = Notice::Lapsed {
        why: "HTTP 500".into(),
    };
    let lost = || RenewError::Lost("Lock prod/web was deleted".into());
    // (script, seconds run, times of the tries, notices, lost)
    let cases = [
        // Every third of the lease, one lease ahead.
        (vec![], 90, &[20, 40, 60, 80][..], vec![], false),
        // Fails from 20 s on, retried every 5 s until the try at 55 s; told only near the end.
        (
            vec![failed(); 7],
            80,
            &[20, 25, 30, 35, 40, 45, 50, 55, 75],
            vec![failing(15), failing(10), Notice::Recovered],
            false,
        ),
        // Fails from 20 s to 70 s included: the lease ends at 60 s, told once, still renewed.
        (
            vec![failed(); 11],
            76,
            &[20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75],
            vec![
                failing(15),
                failing(10),
                failing(5),
                lapsed,
                Notice::Recovered,
            ],
            false,
        ),
        // A lost lock stops the renewals.
        (
            vec![Ok(()), Err(lost())],
            300,
            &[20, 40],
            vec![Notice::Lost("Lock prod/web was deleted".into())],
            true,
        ),
    ];
    for (script, seconds, times, notices, lost) in cases {
        let fake = Fake::new(script);
        let (told, gone) = keep_for(&fake, seconds).await;
        let calls = fake.calls();
        // Each try asks for a full lease from its own time.
        for (at, expires) in &calls {
            assert_eq!(*expires, wall(at + 60), "{times:?}");
        }
        let tried: Vec<u64> = calls.iter().map(|(at, _)| *at).collect();
        assert_eq!((tried.as_slice(), told), (times, notices));
        assert_eq!(gone.is_some(), lost);
    }
}

/// Nothing is renewed before the lock exists; the schedule counts from the first lease.
#[tokio::test(start_paused = true)]
async fn renewals_wait_for_the_lock_and_count_from_its_lease() {
    let fake = Fake::new(vec![]);
    let (tx, rx) = watch::channel(None);
    let kept = keep(LEASE, clock(), Instant::now() + LEASE, rx, |_| {});
    let created = async {
        tokio::time::sleep(Duration::from_secs(12)).await;
        tx.send_replace(Some(fake.clone()));
        tokio::time::sleep(Duration::from_secs(30)).await;
    };
    tokio::select! {
        _ = kept => panic!("not lost"),
        () = created => {}
    }
    assert_eq!(fake.calls(), [(20, wall(80)), (40, wall(100))]);

    // A sender dropped without a lock: nothing, ever.
    let (tx, rx) = watch::channel::<Option<Fake>>(None);
    drop(tx);
    let kept = keep(LEASE, clock(), Instant::now(), rx, |_| {});
    tokio::select! {
        _ = kept => panic!("not lost"),
        () = tokio::time::sleep(Duration::from_secs(600)) => {}
    }
}

#[test]
fn short_leases_retry_sooner() {
    assert_eq!(retry(Duration::from_secs(6)), Duration::from_millis(500));
    assert_eq!(retry(MIN_LEASE), Duration::from_millis(250));
    assert_eq!(retry(Duration::from_secs(600)), Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn wall_times_round_up_to_the_second() {
    let clock = clock();
    let at = |ms: u64| clock.wall(clock.at + Duration::from_millis(ms)).to_string();
    assert_eq!(at(0), "2026-01-01T00:00:00Z");
    assert_eq!(at(1), "2026-01-01T00:00:01Z");
    assert_eq!(at(60_000), "2026-01-01T00:01:00Z");
    // Before the anchor counts as the anchor.
    assert_eq!(
        clock.wall(clock.at - Duration::from_secs(5)).to_string(),
        "2026-01-01T00:00:00Z"
    );
}
