//! Dinic's max-flow on integer capacities. Integers, not floats, so that "the demand fits" is
//! an exact test and cycle cancelling in [`crate::schedule`] preserves sums exactly.

#[derive(Debug, Clone)]
struct Edge {
    to: usize,
    cap: i64,
}

/// A flow network; edges are added in pairs (forward, reverse), so edge `e ^ 1` is `e`'s
/// reverse and the flow on a forward edge is its reverse's residual capacity.
#[derive(Debug, Clone)]
pub struct Flow {
    edges: Vec<Edge>,
    adj: Vec<Vec<usize>>,
    level: Vec<i32>,
    next: Vec<usize>,
}

impl Flow {
    pub fn new(vertices: usize) -> Flow {
        Flow {
            edges: Vec::new(),
            adj: vec![Vec::new(); vertices],
            level: vec![0; vertices],
            next: vec![0; vertices],
        }
    }

    /// Adds `from → to` with capacity `cap` and returns its edge index.
    pub fn add(&mut self, from: usize, to: usize, cap: i64) -> usize {
        let e = self.edges.len();
        self.edges.push(Edge { to, cap });
        self.edges.push(Edge { to: from, cap: 0 });
        self.adj[from].push(e);
        self.adj[to].push(e + 1);
        e
    }

    /// Flow currently on forward edge `e`.
    pub fn flow(&self, e: usize) -> i64 {
        self.edges[e ^ 1].cap
    }

    fn bfs(&mut self, s: usize, t: usize) -> bool {
        self.level.iter_mut().for_each(|l| *l = -1);
        let mut queue = std::collections::VecDeque::new();
        self.level[s] = 0;
        queue.push_back(s);
        while let Some(v) = queue.pop_front() {
            for &e in &self.adj[v] {
                let Edge { to, cap } = self.edges[e];
                if cap > 0 && self.level[to] < 0 {
                    self.level[to] = self.level[v] + 1;
                    queue.push_back(to);
                }
            }
        }
        self.level[t] >= 0
    }

    fn dfs(&mut self, v: usize, t: usize, pushed: i64) -> i64 {
        if v == t {
            return pushed;
        }
        while self.next[v] < self.adj[v].len() {
            let e = self.adj[v][self.next[v]];
            let Edge { to, cap } = self.edges[e];
            if cap > 0 && self.level[to] == self.level[v] + 1 {
                let got = self.dfs(to, t, pushed.min(cap));
                if got > 0 {
                    self.edges[e].cap -= got;
                    self.edges[e ^ 1].cap += got;
                    return got;
                }
            }
            self.next[v] += 1;
        }
        0
    }

    /// Maximum flow from `s` to `t` (added to whatever flow is already there).
    pub fn max_flow(&mut self, s: usize, t: usize) -> i64 {
        let mut total = 0;
        while self.bfs(s, t) {
            self.next.iter_mut().for_each(|n| *n = 0);
            loop {
                let f = self.dfs(s, t, i64::MAX);
                if f == 0 {
                    break;
                }
                total += f;
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bipartite_flow_is_limited_by_the_cut() {
        // s → a (5), s → b (5); a → x (10), b → x (10); x → t (7).
        let mut f = Flow::new(5);
        let sa = f.add(0, 1, 5);
        f.add(0, 2, 5);
        f.add(1, 3, 10);
        f.add(2, 3, 10);
        f.add(3, 4, 7);
        assert_eq!(f.max_flow(0, 4), 7);
        assert!(f.flow(sa) <= 5);
    }

    #[test]
    fn flow_reroutes_through_reverse_edges() {
        // The classic case where a greedy path must be undone.
        let mut f = Flow::new(4);
        f.add(0, 1, 1);
        f.add(0, 2, 1);
        f.add(1, 2, 1);
        f.add(1, 3, 1);
        f.add(2, 3, 1);
        assert_eq!(f.max_flow(0, 3), 2);
    }
}
