//! Per-job baselines and the "most of the last W" rule that turns single observations into a
//! lasting condition. Both are fixed-size values (no heap), so the analyzer can keep one per
//! (group, op, rank) at 16k ranks without its memory growing with the job's age.

/// How many completed ops are learned before a baseline is trusted.
pub(crate) const LEARN: usize = 20;

/// The longest window [`Hits`] can hold (one bit per observation).
pub(crate) const MAX_WINDOW: u32 = 32;

/// One quantity's normal value, learned from the job's own history: the median of its first
/// [`LEARN`] observations, then a slow moving average that only takes observations the caller
/// judged normal. Because anomalous observations are never taken, the baseline freezes while an
/// anomaly lasts, and because the first observations are taken as they come, an imbalance that
/// exists from the start (a slower pipeline stage) becomes part of normal.
#[derive(Clone, Debug)]
pub(crate) struct Baseline {
    samples: [f32; LEARN],
    n: u8,
    value: f32,
}

impl Default for Baseline {
    fn default() -> Self {
        Baseline {
            samples: [0.0; LEARN],
            n: 0,
            value: 0.0,
        }
    }
}

/// Weight of one normal observation once learned (1/32: a drift is followed over ~100 ops).
const DRIFT: f32 = 1.0 / 32.0;

impl Baseline {
    /// The learned value, once [`LEARN`] observations have been seen.
    pub(crate) fn value(&self) -> Option<f32> {
        (usize::from(self.n) >= LEARN).then_some(self.value)
    }

    /// Takes one observation; `normal` is the caller's judgement against the current value and
    /// is ignored while learning.
    pub(crate) fn observe(&mut self, x: f32, normal: bool) {
        let n = usize::from(self.n);
        if n < LEARN {
            self.samples[n] = x;
            self.n += 1;
            if n + 1 == LEARN {
                self.value = median(&mut self.samples);
            }
        } else if normal {
            self.value += (x - self.value) * DRIFT;
        }
    }
}

/// The median of a small slice (reorders it).
pub(crate) fn median(xs: &mut [f32]) -> f32 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_unstable_by(f32::total_cmp);
    xs[xs.len() / 2]
}

/// A condition judged over the last `window` observations with hysteresis: it becomes active
/// when it held in most of them (at least `need`) and clears only when it held in none, so
/// one odd step neither raises nor clears it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Hits {
    bits: u32,
    active: bool,
}

impl Hits {
    /// Records one observation; returns whether the condition is active afterwards.
    pub(crate) fn push(&mut self, hit: bool, window: u32) -> bool {
        let window = window.clamp(1, MAX_WINDOW);
        let mask = if window == MAX_WINDOW {
            u32::MAX
        } else {
            (1u32 << window) - 1
        };
        self.bits = ((self.bits << 1) | u32::from(hit)) & mask;
        let count = self.bits.count_ones();
        if count >= need(window) {
            self.active = true;
        } else if count == 0 {
            self.active = false;
        }
        self.active
    }

    pub(crate) fn active(&self) -> bool {
        self.active
    }

    /// How many of the last observations held.
    pub(crate) fn count(&self) -> u32 {
        self.bits.count_ones()
    }
}

/// "Most of" a window: three quarters, rounded up.
pub(crate) fn need(window: u32) -> u32 {
    (3 * window).div_ceil(4).max(1)
}

/// A small ring of recent values, for "typical duration" without keeping history.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Recent {
    values: [f32; 16],
    n: u8,
    next: u8,
}

impl Recent {
    pub(crate) fn push(&mut self, x: f32) {
        self.values[usize::from(self.next)] = x;
        self.next = (self.next + 1) % 16;
        self.n = (self.n + 1).min(16);
    }

    /// The median of the retained values, if any.
    pub(crate) fn median(&self) -> Option<f32> {
        if self.n == 0 {
            return None;
        }
        let mut v = self.values;
        Some(median(&mut v[..usize::from(self.n)]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_is_the_median_of_the_first_observations_and_ignores_anomalies() {
        let mut b = Baseline::default();
        for i in 0..LEARN {
            assert_eq!(b.value(), None);
            // One wild value while learning does not move the median.
            b.observe(if i == 3 { 1000.0 } else { 10.0 }, true);
        }
        assert_eq!(b.value(), Some(10.0));
        for _ in 0..100 {
            b.observe(50.0, false);
        }
        assert_eq!(b.value(), Some(10.0));
        b.observe(42.0, true);
        assert!(b.value().is_some_and(|v| v > 10.0 && v < 12.0));
    }

    #[test]
    fn hits_need_most_of_the_window_and_clear_only_after_a_quiet_window() {
        let mut h = Hits::default();
        // A single hit never activates.
        assert!(!h.push(true, 8));
        for _ in 0..7 {
            h.push(false, 8);
        }
        assert!(!h.active());
        for _ in 0..5 {
            assert!(!h.push(true, 8));
        }
        assert!(h.push(true, 8)); // 6 of the last 8
        for _ in 0..7 {
            assert!(h.push(false, 8));
        }
        assert!(!h.push(false, 8));
        assert_eq!(need(8), 6);
    }

    #[test]
    fn recent_keeps_sixteen_values() {
        let mut r = Recent::default();
        assert_eq!(r.median(), None);
        for i in 0..100 {
            r.push(i as f32);
        }
        assert_eq!(r.median(), Some(92.0));
    }
}
