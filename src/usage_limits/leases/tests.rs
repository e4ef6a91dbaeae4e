use super::*;
use crate::unit_tests::test;
use gateway_schema::limits::Period;

fn demand(kind: LimitKind, amount: u64) -> Demand {
    Demand { key: LedgerKey { limit: "team".into(), kind }, amount, bound: 100, period: Period::Month }
}

fn grant(id: &str, granted: u64) -> Grant {
    Grant { lease: Some(id.into()), granted, ttl_ms: 5000, bound: 100, remaining: 50, reset_s: 30, ..Grant::default() }
}

fn report(lease: &str, used: u64, uses: &[[u64; 2]]) -> Report {
    Report { lease: lease.into(), used, uses: uses.to_vec() }
}

#[test]
fn a_request_reserves_from_the_lease_and_asks_when_it_has_no_room() {
    let mut leases = Leases::default();
    let one = demand(LimitKind::Requests, 1);
    assert_eq!(leases.reserve(&one, 0), None, "no lease yet");
    let cold = Ask { limit: "team".into(), kind: LimitKind::Requests, need: 1, want: 1 };
    assert_eq!(leases.ask(&one, 0), (cold, vec![]));
    leases.granted(&one.key, &grant("l1", 2), 0, 0);
    assert!(leases.reserve(&one, 10).is_some());
    assert!(leases.reserve(&one, 20).is_some());
    assert_eq!(leases.reserve(&one, 30), None, "two granted, two used");
    // The next ask gives the lease back, and wants twice what it would have used over its
    // 5 s at its rate, measured over 250 ms at least (a twentieth of its life): 2 × 2 × 20.
    let (ask, reports) = leases.ask(&one, 30);
    assert_eq!((ask.want, reports), (80, vec![report("l1", 2, &[[100, 2]])]));
    let standing = leases.standing(&one.key, 30).unwrap();
    assert_eq!((standing.bound, standing.remaining, standing.reset_s), (100, 50, 30));
}

#[test]
fn a_lease_used_up_early_asks_for_what_its_rate_would_use_over_a_whole_lease() {
    let mut leases = Leases::default();
    let one = demand(LimitKind::Requests, 1);
    leases.granted(&one.key, &grant("l1", 100), 0, 0);
    for at in 0..100 {
        leases.reserve(&one, at * 10).unwrap();
    }
    // 100 in its first second of five: 500 over a lease, and twice that is asked.
    assert_eq!(leases.ask(&one, 1000).0.want, 1000);
    leases.granted(&one.key, &grant("l2", 1000), 1000, 1000);
    // Renewed ahead at the same rate: 350 used in 3.5 s, 500 over a lease.
    for at in 0..350 {
        leases.reserve(&one, 1000 + at * 10).unwrap();
    }
    let (_, asks) = leases.due(6000 - RENEW_AHEAD_MS);
    assert_eq!(asks.iter().map(|a| a.want).collect::<Vec<_>>(), vec![1000]);
    // The load pauses: l2 ends having used 350 in its life, the renewal goes unused, and the
    // next request asks for twice l2's 350: an unused lease says nothing of the rate.
    leases.granted(&one.key, &grant("l3", 1000), 6000, 6000);
    assert_eq!(leases.ask(&one, 11_000).0.want, 700);
}

#[test]
fn settled_usage_below_the_reservation_frees_the_difference() {
    let mut leases = Leases::default();
    let worst = demand(LimitKind::Tokens, 600);
    leases.granted(&worst.key, &grant("l1", 1000), 0, 0);
    let hold = leases.reserve(&worst, 0).unwrap();
    assert_eq!(leases.reserve(&worst, 0), None, "400 left: the next worst case does not fit");
    assert!(!leases.settle(&hold, 150), "the active lease is not reported");
    assert!(leases.reserve(&worst, 0).is_some(), "850 left after settling 150");
}

#[test]
fn a_lease_is_reported_once_it_ended_and_every_reservation_settled() {
    let mut leases = Leases::default();
    let worst = demand(LimitKind::Budget, 300);
    leases.granted(&worst.key, &grant("l1", 1000), 0, 0);
    let hold = leases.reserve(&worst, 100).unwrap();
    assert_eq!(leases.due(1000), (vec![], vec![]), "active, not ending");
    // It ends (no renewal: a renewal is asked only ahead of the end, see below).
    let (reports, _) = leases.due(5000);
    assert_eq!(reports, vec![], "a reservation is still open");
    assert!(leases.settle(&hold, 120), "its last reservation settled: to be reported");
    assert_eq!(leases.next_due_ms(5100), Some(5100), "settled: due at once");
    let (reports, _) = leases.due(5100);
    assert_eq!(reports, vec![report("l1", 120, &[])]);
    assert_eq!(leases.due(5200).0, vec![], "reported once");
}

#[test]
fn a_lease_held_too_long_is_reported_with_its_open_reservations_counted() {
    let mut leases = Leases::default();
    let worst = demand(LimitKind::Tokens, 300);
    leases.granted(&worst.key, &grant("l1", 1000), 0, 0);
    leases.reserve(&worst, 0).unwrap();
    leases.due(5000);
    assert_eq!(leases.next_due_ms(5000), Some(5000 + DRAIN_MS));
    assert_eq!(leases.due(5000 + DRAIN_MS).0, vec![report("l1", 300, &[[0, 300]])]);
}

#[test]
fn a_lease_in_use_is_renewed_ahead_once_and_an_idle_one_is_not() {
    let mut leases = Leases::default();
    let one = demand(LimitKind::Requests, 1);
    leases.granted(&one.key, &grant("l1", 10), 0, 0);
    leases.reserve(&one, 100).unwrap();
    assert_eq!(leases.next_due_ms(100), Some(5000 - RENEW_AHEAD_MS));
    let (reports, asks) = leases.due(5000 - RENEW_AHEAD_MS);
    assert_eq!(reports, vec![]);
    assert_eq!(asks, vec![Ask { limit: "team".into(), kind: LimitKind::Requests, need: 1, want: 2 }]);
    // Asked: not again while the renewal is on its way, and the timer does not spin.
    assert_eq!(leases.due(5000 - RENEW_AHEAD_MS + 10).1, vec![]);
    assert_eq!(leases.next_due_ms(5000 - RENEW_AHEAD_MS + 10), Some(5000));
    // The renewal arrives: the old lease is reported with what it used.
    leases.granted(&one.key, &grant("l2", 10), 4000, 4000);
    assert_eq!(leases.due(4000).0, vec![report("l1", 1, &[[100, 1]])]);

    let mut idle = Leases::default();
    idle.granted(&one.key, &grant("l1", 10), 0, 0);
    idle.reserve(&one, 0).unwrap();
    let late = RENEW_WHILE_USED_MS + 1;
    idle.granted(&one.key, &grant("l2", 10), late - 4000, late - 4000);
    assert_eq!(idle.due(late).1, vec![], "unused for longer than RENEW_WHILE_USED_MS");
}

#[test]
fn reports_the_control_plane_did_not_take_go_again() {
    let mut leases = Leases::default();
    let one = demand(LimitKind::Requests, 1);
    leases.granted(&one.key, &grant("l1", 10), 0, 0);
    leases.reserve(&one, 0).unwrap();
    let (reports, asks) = leases.due(6000);
    assert_eq!(reports.len(), 1);
    leases.call_failed(reports.clone(), &asks, 6000);
    assert_eq!(leases.next_due_ms(6000), Some(6000 + RETRY_MS));
    assert_eq!(leases.due(7000).0, reports);
}

#[test]
fn a_gone_limit_keeps_nothing_to_renew() {
    let mut leases = Leases::default();
    let one = demand(LimitKind::Requests, 1);
    leases.granted(&one.key, &grant("l1", 10), 0, 0);
    leases.reserve(&one, 0).unwrap();
    leases.granted(&one.key, &Grant { gone: true, ..Grant::default() }, 100, 100);
    assert_eq!(leases.reserve(&one, 100), None);
    assert_eq!(leases.due(100), (vec![report("l1", 1, &[[0, 1]])], vec![]));
}

#[test]
fn an_ask_gives_back_the_leases_whose_reservations_settled_but_not_the_others() {
    let mut leases = Leases::default();
    let worst = demand(LimitKind::Budget, 600);
    leases.granted(&worst.key, &grant("l1", 1000), 0, 0);
    let open = leases.reserve(&worst, 0).unwrap();
    // 400 left: the next worst case asks, and l1 (a reservation still open) stays out.
    assert_eq!(leases.reserve(&worst, 10), None);
    let (_, reports) = leases.ask(&worst, 10);
    assert_eq!(reports, vec![]);
    leases.granted(&worst.key, &grant("l2", 1000), 20, 20);
    let done = leases.reserve(&worst, 30).unwrap();
    leases.settle(&done, 50);
    leases.settle(&open, 70);
    let (_, reports) = leases.ask(&demand(LimitKind::Budget, 990), 40);
    assert_eq!(reports, vec![report("l1", 70, &[]), report("l2", 50, &[])]);
}

#[test]
fn reports_of_a_failed_ask_go_with_the_timers_next_call() {
    let mut leases = Leases::default();
    let one = demand(LimitKind::Requests, 1);
    leases.granted(&one.key, &grant("l1", 1), 0, 0);
    leases.reserve(&one, 0).unwrap();
    let (_, reports) = leases.ask(&one, 10);
    leases.call_failed(reports.clone(), &[], 10);
    assert_eq!(leases.due(20).0, reports);
}

#[test]
fn a_refused_renewal_is_not_asked_again_at_once() {
    let mut leases = Leases::default();
    let one = demand(LimitKind::Requests, 1);
    leases.granted(&one.key, &grant("l1", 10), 0, 0);
    leases.reserve(&one, 100).unwrap();
    let ahead = 5000 - RENEW_AHEAD_MS;
    assert_eq!(leases.due(ahead).1.len(), 1);
    leases.granted(&one.key, &Grant { bound: 100, ..Grant::default() }, ahead + 5, ahead + 5);
    // Not before RETRY_MS: the timer waits (it does not spin asking).
    assert_eq!(leases.next_due_ms(ahead + 10), Some(ahead + 5 + RETRY_MS));
    assert_eq!(leases.due(ahead + 10).1, vec![]);
    assert_eq!(leases.due(ahead + 5 + RETRY_MS).1.len(), 1);
}

#[test]
fn a_reservation_on_an_idle_ledger_asks_for_the_timer_once() {
    let mut leases = Leases::default();
    let one = demand(LimitKind::Requests, 1);
    leases.granted(&one.key, &Grant { ttl_ms: 60_000, ..grant("l1", 10) }, 0, 0);
    leases.reserve(&one, 0).unwrap();
    assert!(!leases.take_woken(), "in use: the timer already renews it ahead");
    assert_eq!(leases.next_due_ms(20_000), Some(60_000), "idle: only its end is due");
    leases.reserve(&one, 20_000).unwrap();
    assert!(leases.take_woken(), "in use again: the timer must renew it ahead");
    assert!(!leases.take_woken(), "once");
    assert_eq!(leases.next_due_ms(20_000), Some(60_000 - RENEW_AHEAD_MS));
}

#[test]
fn a_report_says_when_each_use_was_admitted_so_it_counts_from_then() {
    let mut leases = Leases::default();
    let tokens = demand(LimitKind::Tokens, 100);
    leases.granted(&tokens.key, &grant("l1", 1000), 0, 0);
    // Admitted at 10 and 90 ms (one 100 ms slot), then at 1250 ms.
    let first = leases.reserve(&tokens, 10).unwrap();
    let second = leases.reserve(&tokens, 90).unwrap();
    let third = leases.reserve(&tokens, 1250).unwrap();
    // Each settles with what it used, in its own slot, however late its answer ends.
    leases.settle(&first, 30);
    leases.settle(&third, 0);
    leases.settle(&second, 45);
    // Reported at 6000 ms: each slot by its end's offset from when the lease was asked (at 0 ms),
    // never before an admission, however late the report goes (a use settled unused is not told).
    let (reports, _) = leases.due(6000);
    assert_eq!(reports, vec![report("l1", 75, &[[100, 75]])]);
    // A lease asked for before it came counts its admissions from the ask.
    let mut asked_early = Leases::default();
    asked_early.granted(&tokens.key, &grant("l2", 1000), 400, 700);
    let hold = asked_early.reserve(&tokens, 750).unwrap();
    asked_early.settle(&hold, 10);
    assert_eq!(asked_early.due(5700).0, vec![report("l2", 10, &[[400, 10]])]);
    // A budget's period counts whole: no ages.
    let budget = demand(LimitKind::Budget, 100);
    leases.granted(&budget.key, &grant("b1", 1000), 0, 0);
    let held = leases.reserve(&budget, 10).unwrap();
    leases.settle(&held, 60);
    assert_eq!(leases.due(6000).0, vec![report("b1", 60, &[])]);
}
