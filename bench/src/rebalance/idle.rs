//! Committed progress per partition, and how long each partition went without it around a group
//! event (pure: times are seconds since the repeat began, offsets as a poll saw them).
//!
//! A partition *advances* when the group's committed offset on it is seen higher than at the poll
//! before (a first commit counts). The *idle time* of a partition for an event is the longest
//! stretch without an advance inside the event's window, where a stretch starts at the event
//! itself or at an advance after it, and ends at the next advance (or at the window's close). Why
//! the longest stretch and not "from the event to the next advance": after a SIGTERM the stopping
//! instance commits its open transaction on the way out, so each of its partitions advances once
//! right after the signal and only then waits for its new owner; after a join the partitions that
//! move are committed by their old owner when it gives them up, a second or more after the spawn.
//! The wait that matters starts after that last commit, and "until the next advance" would
//! measure the goodbye commit instead.
//!
//! Only partitions that had advanced before the event count (a partition nobody ever committed
//! has no progress to lose).
//!
//! # The window
//! Opened at the event. It may close (the event is *settled*) once
//! 1. its anchor has been seen: the point after which the event has fully taken place (the
//!    stopped instance has exited, the joining one has committed, the killed one is gone), and
//! 2. every counted partition has advanced after the anchor, and
//! 3. for `hold` in a row, no counted partition has gone `quiet` or longer without an advance.
//!
//! A partition stalled when the window closes keeps its open stretch as its idle time (a figure
//! that is at least that long; [`Window::close`] says whether the window settled).
//!
//! The poll's own period bounds the resolution: an advance is timed when a poll sees it, up to a
//! period (plus the fetch's round trip) after the commit.

/// Each partition's committed offset and the time of its last advance.
#[derive(Debug, Clone)]
pub struct Progress {
    offsets: Vec<Option<i64>>,
    last_advance: Vec<Option<f64>>,
}

impl Progress {
    pub fn new(partitions: usize) -> Self {
        Progress {
            offsets: vec![None; partitions],
            last_advance: vec![None; partitions],
        }
    }

    /// Takes one poll's committed offsets (by partition; `None`: nothing committed), seen at `t`,
    /// and returns the partitions that advanced.
    pub fn observe(&mut self, t: f64, committed: &[Option<i64>]) -> Vec<usize> {
        let mut advanced = Vec::new();
        for (p, (known, seen)) in self.offsets.iter_mut().zip(committed).enumerate() {
            // `None < Some(_)`: a first commit is an advance; an offset seen lower (a poll
            // answered by a lagging coordinator) is not taken, so it cannot count twice.
            if *seen > *known {
                *known = *seen;
                self.last_advance[p] = Some(t);
                advanced.push(p);
            }
        }
        advanced
    }

    /// When the partition last advanced.
    pub fn last_advance(&self, partition: usize) -> Option<f64> {
        self.last_advance.get(partition).copied().flatten()
    }

    pub fn partitions(&self) -> usize {
        self.offsets.len()
    }
}

/// When an event counts as over ([`Window`], conditions 2 and 3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settle {
    /// A partition this long without an advance is not progressing (s).
    pub quiet: f64,
    /// Every partition progressing for this long in a row: settled (s).
    pub hold: f64,
}

/// One event's window over every partition.
#[derive(Debug, Clone)]
pub struct Window {
    t0: f64,
    /// Partitions that had advanced before the event: only they are measured.
    counted: Vec<bool>,
    /// Where each partition's current stretch without an advance began: the event, or its last
    /// advance since.
    stretch_from: Vec<f64>,
    /// The longest stretch each partition has finished in the window.
    longest: Vec<f64>,
    /// When the event had fully taken place (condition 1).
    anchor: Option<f64>,
    /// Which partitions advanced after the anchor (condition 2).
    after_anchor: Vec<bool>,
    /// Since when conditions 2 and 3 have held without a break.
    progressing_since: Option<f64>,
}

/// What a window found.
#[derive(Debug, Clone, PartialEq)]
pub struct Closed {
    /// Idle time per partition (s); `None` for a partition that had no progress before.
    pub idle: Vec<Option<f64>>,
    /// The window settled (else it was closed at its deadline, and the open stretches count).
    pub settled: bool,
    /// From the event to its anchor (s), if seen.
    pub anchor_after: Option<f64>,
    /// From the event to the window's close (s).
    pub closed_after: f64,
}

impl Window {
    /// Opens the window of an event at `t0`, counting the partitions that advanced before it.
    pub fn open(t0: f64, progress: &Progress) -> Self {
        let n = progress.partitions();
        Window {
            t0,
            counted: (0..n).map(|p| progress.last_advance(p).is_some()).collect(),
            stretch_from: vec![t0; n],
            longest: vec![0.0; n],
            anchor: None,
            after_anchor: vec![false; n],
            progressing_since: None,
        }
    }

    /// Opens a window at `t0` in which every one of `partitions` counts: the start, where no
    /// partition has advanced yet and every one must.
    pub fn open_all(t0: f64, partitions: usize) -> Self {
        let mut w = Window::open(t0, &Progress::new(partitions));
        w.counted = vec![true; partitions];
        w
    }

    /// The event has fully taken place at `t` (only the first call counts).
    pub fn anchor(&mut self, t: f64) {
        self.anchor.get_or_insert(t);
    }

    pub fn anchored(&self) -> bool {
        self.anchor.is_some()
    }

    /// Takes the partitions that advanced at `t` ([`Progress::observe`]).
    pub fn observe(&mut self, t: f64, advanced: &[usize]) {
        for &p in advanced {
            let Some(from) = self.stretch_from.get_mut(p) else {
                continue;
            };
            self.longest[p] = self.longest[p].max(t - *from);
            *from = t;
            if self.anchor.is_some_and(|a| t >= a) {
                self.after_anchor[p] = true;
            }
        }
    }

    /// Whether the event is settled at `t` (call after each [`Window::observe`]).
    pub fn settled(&mut self, t: f64, rule: Settle) -> bool {
        if self.anchor.is_none() {
            return false;
        }
        let progressing = (0..self.counted.len())
            .filter(|&p| self.counted[p])
            .all(|p| self.after_anchor[p] && t - self.stretch_from[p] < rule.quiet);
        if !progressing {
            self.progressing_since = None;
            return false;
        }
        let since = *self.progressing_since.get_or_insert(t);
        t - since >= rule.hold
    }

    /// Closes the window at `t`: each counted partition's idle time, the open stretch included.
    pub fn close(self, t: f64, settled: bool) -> Closed {
        Closed {
            idle: (0..self.counted.len())
                .map(|p| self.counted[p].then(|| self.longest[p].max(t - self.stretch_from[p])))
                .collect(),
            settled,
            anchor_after: self.anchor.map(|a| a - self.t0),
            closed_after: t - self.t0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Settle = Settle {
        quiet: 1.0,
        hold: 2.0,
    };

    /// Feeds `offsets` at `t` to both.
    fn step(progress: &mut Progress, window: &mut Window, t: f64, offsets: &[Option<i64>]) {
        let advanced = progress.observe(t, offsets);
        window.observe(t, &advanced);
    }

    fn close_enough(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn an_advance_is_a_higher_offset_and_a_first_commit() {
        let mut p = Progress::new(3);
        assert_eq!(p.observe(0.0, &[None, Some(5), None]), [1]);
        assert_eq!(p.observe(0.1, &[Some(1), Some(5), None]), [0]);
        // Lower than seen before (a lagging answer): not an advance, and not forgotten.
        assert!(p.observe(0.2, &[Some(0), Some(4), None]).is_empty());
        assert_eq!(p.observe(0.3, &[Some(1), Some(6), None]), [1]);
        assert_eq!(p.last_advance(1), Some(0.3));
        assert_eq!(p.last_advance(2), None);
    }

    /// Partition 0 progresses every 0.1 s throughout; partition 1 commits once on the way out
    /// (0.1 s after the event), then waits for its new owner until 3.0 s; partition 2 never
    /// advanced before the event and is not measured.
    #[test]
    fn the_idle_time_is_the_longest_stretch_not_the_first_advance() {
        let mut p = Progress::new(3);
        p.observe(-0.1, &[Some(0), Some(0), None]);
        let mut w = Window::open(0.0, &p);
        let (mut o0, mut o1) = (0, 0);
        for i in 1..=60 {
            let t = f64::from(i) / 10.0;
            o0 += 1;
            if close_enough(t, 0.1) || t >= 3.0 - 1e-9 {
                o1 += 1;
            }
            step(&mut p, &mut w, t, &[Some(o0), Some(o1), None]);
            if close_enough(t, 0.5) {
                w.anchor(t); // the stopped instance has exited
            }
        }
        let closed = w.close(6.0, true);
        let idle = closed.idle;
        assert!(close_enough(idle[0].unwrap(), 0.1), "{idle:?}");
        assert!(close_enough(idle[1].unwrap(), 2.9), "{idle:?}");
        assert_eq!(idle[2], None);
        assert_eq!(closed.anchor_after, Some(0.5));
    }

    #[test]
    fn a_window_settles_only_after_its_anchor_and_every_partition_progressing_for_the_hold() {
        let mut p = Progress::new(2);
        p.observe(-0.1, &[Some(0), Some(0)]);
        let mut w = Window::open(0.0, &p);
        let mut settled_at = None;
        let mut o = [0i64, 0];
        for i in 1..=150 {
            let t = f64::from(i) / 10.0;
            o[0] += 1;
            // Partition 1 stalls from the event until 4.0 s (a killed owner's partition).
            if t >= 4.0 - 1e-9 {
                o[1] += 1;
            }
            step(&mut p, &mut w, t, &[Some(o[0]), Some(o[1])]);
            if close_enough(t, 1.0) {
                w.anchor(t);
            }
            if w.settled(t, RULE) {
                settled_at = Some(t);
                break;
            }
        }
        // Both progressing from 4.0 s; settled a hold later.
        let settled_at = settled_at.expect("settles");
        assert!(close_enough(settled_at, 6.0), "{settled_at}");
        let closed = w.close(settled_at, true);
        assert!(
            close_enough(closed.idle[1].unwrap(), 4.0),
            "{:?}",
            closed.idle
        );
        assert!(close_enough(closed.closed_after, 6.0));
    }

    #[test]
    fn no_anchor_no_settling_and_a_stall_in_the_hold_starts_it_again() {
        let mut p = Progress::new(1);
        p.observe(0.0, &[Some(0)]);
        let mut w = Window::open(0.0, &p);
        let mut o = 0;
        for i in 1..=40 {
            let t = f64::from(i) / 10.0;
            o += 1;
            step(&mut p, &mut w, t, &[Some(o)]);
            assert!(!w.settled(t, RULE), "not anchored at {t}");
        }
        w.anchor(4.0);
        // Progressing from 4.1 s, then silent from 5.0 s for 1.5 s: the hold starts again at
        // 6.5 s and ends at 8.5 s.
        let mut settled_at = None;
        for i in 41..=120 {
            let t = f64::from(i) / 10.0;
            if !(5.0 + 1e-9..6.5 - 1e-9).contains(&t) {
                o += 1;
                step(&mut p, &mut w, t, &[Some(o)]);
            }
            if w.settled(t, RULE) {
                settled_at = Some(t);
                break;
            }
        }
        let settled_at = settled_at.expect("settles");
        assert!(close_enough(settled_at, 8.5), "{settled_at}");
        assert!(close_enough(
            w.close(settled_at, true).idle[0].unwrap(),
            1.5
        ));
    }

    #[test]
    fn a_window_closed_at_its_deadline_counts_the_open_stretch() {
        let mut p = Progress::new(2);
        p.observe(0.0, &[Some(1), Some(1)]);
        let mut w = Window::open(1.0, &p);
        step(&mut p, &mut w, 1.5, &[Some(2), Some(1)]);
        let closed = w.close(11.0, false);
        assert!(!closed.settled);
        assert_eq!(closed.idle, [Some(9.5), Some(10.0)]);
        assert_eq!(closed.anchor_after, None);
    }
}
