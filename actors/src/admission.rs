//! Admission control for operator requests: a node serves at most `limit` admin requests at
//! once and refuses the rest at the door ("busy", nothing done), so a flood of CLI or benchmark
//! traffic queues in the clients, not as unbounded tasks inside the node.

/// The gate's state. Pure: the admin actor's shell calls it around each request.
#[derive(Debug, Clone)]
pub struct Admission {
    limit: usize,
    in_flight: usize,
    served: u64,
    refused: u64,
}

impl Admission {
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            in_flight: 0,
            served: 0,
            refused: 0,
        }
    }

    /// Admits one request if there is room.
    pub fn try_admit(&mut self) -> bool {
        if self.in_flight < self.limit {
            self.in_flight += 1;
            self.served += 1;
            true
        } else {
            self.refused += 1;
            false
        }
    }

    /// One admitted request finished.
    pub fn release(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Admitted so far.
    pub fn served(&self) -> u64 {
        self.served
    }

    /// Refused so far.
    pub fn refused(&self) -> u64 {
        self.refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn refuses_beyond_the_limit_and_admits_again_after_release() {
        let mut g = Admission::new(2);
        assert!(g.try_admit());
        assert!(g.try_admit());
        assert!(!g.try_admit());
        g.release();
        assert!(g.try_admit());
        assert_eq!((g.served(), g.refused(), g.in_flight()), (3, 1, 2));
    }

    proptest! {
        /// Whatever the order of arrivals and completions, in-flight never exceeds the limit
        /// and every arrival is either served or refused.
        #[test]
        fn never_over_the_limit(limit in 1usize..8, ops in proptest::collection::vec(any::<bool>(), 0..200)) {
            let mut g = Admission::new(limit);
            let mut arrivals = 0u64;
            for admit in ops {
                if admit {
                    arrivals += 1;
                    g.try_admit();
                } else if g.in_flight() > 0 {
                    g.release();
                }
                prop_assert!(g.in_flight() <= limit);
            }
            prop_assert_eq!(g.served() + g.refused(), arrivals);
        }
    }
}
