//! What the data planes can hold, read at compile time from the one place the XDP maps are
//! sized (`ebpf/bpf/yard.h`), so that the tables refuse what the maps could not take instead
//! of accepting it and having its traffic silently dropped.
//!
//! The header is parsed here rather than mirrored: a map resized there resizes these bounds
//! with it. (The tables decide deterministically on every node with one build; nodes built
//! with different sizes would decide differently, so a resize, like any change of a bound,
//! rolls out to every node before the larger tables are used.)

const YARD_H: &str = include_str!("../../ebpf/bpf/yard.h");

/// VIPs in the gateway pool: every gateway node's `gw_vips` (and `gw_vip_stats`) holds at most
/// every VIP of the pool.
pub const GATEWAY_VIPS: usize = define(YARD_H, "GW_VIPS_MAX");
/// Endpoints: every gateway node's `gw_endpoints` holds all of them (and `gw_sources` at most
/// one pair per endpoint).
pub const GATEWAY_ENDPOINTS: usize = define(YARD_H, "GW_ENDPOINTS_MAX");
/// Aggregation jobs: an aggregator's `agg_jobs` holds the jobs it serves, at most all of them.
pub const AGG_JOBS: usize = define(YARD_H, "AGG_JOBS_MAX");

/// The decimal value of `#define <name> <value>` in `header`. Evaluated at compile time: a
/// missing or non-numeric definition fails the build.
const fn define(header: &str, name: &str) -> usize {
    let h = header.as_bytes();
    let n = name.as_bytes();
    let prefix = b"#define ";
    let mut i = 0;
    while i + prefix.len() + n.len() < h.len() {
        if (i == 0 || h[i - 1] == b'\n')
            && starts_with(h, i, prefix)
            && starts_with(h, i + prefix.len(), n)
            && h[i + prefix.len() + n.len()] == b' '
        {
            let mut j = i + prefix.len() + n.len();
            while j < h.len() && h[j] == b' ' {
                j += 1;
            }
            let mut value = 0usize;
            let mut digits = 0;
            while j < h.len() && h[j].is_ascii_digit() {
                value = value * 10 + (h[j] - b'0') as usize;
                digits += 1;
                j += 1;
            }
            assert!(digits > 0, "the #define is not a decimal number");
            return value;
        }
        i += 1;
    }
    panic!("yard.h lacks the #define")
}

const fn starts_with(h: &[u8], at: usize, s: &[u8]) -> bool {
    if at + s.len() > h.len() {
        return false;
    }
    let mut k = 0;
    while k < s.len() {
        if h[at + k] != s[k] {
            return false;
        }
        k += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bounds_are_the_headers_map_sizes() {
        let h = "#define A 1\n#define AB 42\n#define ABC  7 /* seven */\n";
        assert_eq!(define(h, "AB"), 42);
        assert_eq!(define(h, "A"), 1);
        assert_eq!(define(h, "ABC"), 7);
        // The real header, as the maps are declared there today.
        assert_eq!(GATEWAY_VIPS, 4096);
        assert_eq!(GATEWAY_ENDPOINTS, 262_144);
        assert_eq!(AGG_JOBS, 1024);
    }
}
