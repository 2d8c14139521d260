//! float32 gradients as block fixed point (SwitchML's scheme, with the exponent sent per chunk
//! and worker so nobody waits for an exponent round).
//!
//! A worker's chunk `x` has block exponent `e`, the least integer with `max|x| < 2^e` (`-128`
//! for an all-zero chunk), and travels as `q = round(x * 2^(F - e))` with
//! `F = frac_bits(workers) = 30 - ceil(log2 workers)`. So `|q| <= 2^F`, and the sum of
//! `workers` of them is at most `2^30` in magnitude: an N-way sum cannot overflow int32, by
//! construction. The aggregator keeps the largest exponent `E` it has seen for the chunk and
//! shifts the finer side right onto it before adding (arithmetic shift, at most 31 places). The
//! result is `acc * 2^(E - F)`.
//!
//! Error: quantising costs each worker at most half a unit of its own scale, the shift onto `E`
//! at most one unit of `E`'s scale, and each of at most `workers - 1` re-scalings of the
//! accumulator one more; so `|result - exact| <= 2.5 * workers * 2^(E - F)` before the final
//! rounding to float32 (half an ulp of the result): [`error_bound`].

/// The fraction bits for a job of `workers` (at least 1).
pub fn frac_bits(workers: u16) -> i32 {
    let n = u32::from(workers.max(1));
    let ceil_log2 = 32 - (n - 1).leading_zeros();
    30 - i32::try_from(ceil_log2).unwrap_or(30)
}

/// The block exponent of `x`: least `e` with `max|x| < 2^e`, or `-128` if `x` is all zero.
/// Infinities and NaN are refused ([`FixedError`]) before this is called.
pub fn block_exp(x: &[f32]) -> i8 {
    let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    if max == 0.0 {
        return i8::MIN;
    }
    // max < 2^e  <=>  e = floor(log2 max) + 1; exact for powers of two via the bits.
    let e = f64::from(max).log2().floor() as i32 + 1;
    let e = if 2f64.powi(e - 1) > f64::from(max) {
        e - 1
    } else if 2f64.powi(e) <= f64::from(max) {
        e + 1
    } else {
        e
    };
    i8::try_from(e.clamp(-127, 127)).unwrap_or(i8::MAX)
}

/// Why a float gradient cannot be aggregated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FixedError {
    #[error("gradient element {index} is {value}, which cannot be summed")]
    NotFinite { index: usize, value: f32 },
}

/// Refuses a gradient holding an infinity or NaN, naming the first.
pub fn check_finite(x: &[f32]) -> Result<(), FixedError> {
    match x.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(FixedError::NotFinite {
            index,
            value: x[index],
        }),
        None => Ok(()),
    }
}

/// One chunk as a worker sends it: its exponent and its values.
pub fn quantize(x: &[f32], workers: u16) -> (i8, Vec<i32>) {
    let e = block_exp(x);
    if e == i8::MIN {
        return (e, vec![0; x.len()]);
    }
    let scale = 2f64.powi(frac_bits(workers) - i32::from(e));
    let q = x
        .iter()
        .map(|v| (f64::from(*v) * scale).round() as i32)
        .collect();
    (e, q)
}

/// A summed chunk back to float32.
pub fn dequantize(acc: &[i32], exp: i8, workers: u16) -> Vec<f32> {
    let scale = 2f64.powi(i32::from(exp) - frac_bits(workers));
    acc.iter().map(|v| (f64::from(*v) * scale) as f32).collect()
}

/// The largest absolute error of a summed element against the exact sum of the inputs, for a
/// result with exponent `exp` over `workers` contributions, before rounding to float32.
pub fn error_bound(workers: u16, exp: i8) -> f64 {
    2.5 * f64::from(workers.max(1)) * 2f64.powi(i32::from(exp) - frac_bits(workers))
}

/// A result `(exp, acc)` of a job of `from` workers in the fixed point of `to` workers (an
/// elastic job that lost a worker replays its last round's results after the regrouping): the
/// same values, `acc * 2^(exp - F(from))`, re-expressed by moving the exponent, which is exact.
/// Only if the exponent leaves i8's range is `acc` shifted instead: right (losing low bits) below
/// it, left (saturating) above it, which needs a chunk beyond about 2^120.
pub fn rebase(exp: i8, acc: &[i32], from: u16, to: u16) -> (i8, Vec<i32>) {
    if exp == i8::MIN {
        return (exp, acc.to_vec()); // an all-zero chunk
    }
    let want = i32::from(exp) + frac_bits(to) - frac_bits(from);
    let clamped = want.clamp(-127, 127);
    let shift = want - clamped;
    let values = acc
        .iter()
        .map(|a| match shift {
            0 => *a,
            s if s < 0 => a >> (-s).min(31),
            s => a.saturating_mul(1i32 << s.min(30)),
        })
        .collect();
    (i8::try_from(clamped).unwrap_or(i8::MAX), values)
}

/// What the aggregator does with one contribution, in plain Rust: `(acc, acc_exp)` plus
/// `(values, exp)`. The XDP program does the same with the same shifts.
pub fn add_into(acc: &mut [i32], acc_exp: &mut i8, values: &[i32], exp: i8) {
    let up = i32::from(exp) - i32::from(*acc_exp);
    let shift_acc = up.clamp(0, 31);
    let shift_val = (-up).clamp(0, 31);
    if up > 0 {
        *acc_exp = exp;
    }
    for (a, v) in acc.iter_mut().zip(values) {
        *a = (*a >> shift_acc).wrapping_add(*v >> shift_val);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frac_bits_leave_room_for_the_sum() {
        assert_eq!(frac_bits(1), 30);
        assert_eq!(frac_bits(2), 29);
        assert_eq!(frac_bits(3), 28);
        assert_eq!(frac_bits(4), 28);
        assert_eq!(frac_bits(64), 24);
    }

    #[test]
    fn block_exponents_bound_the_chunk() {
        assert_eq!(block_exp(&[1.0]), 1);
        assert_eq!(block_exp(&[0.99, -0.5]), 0);
        assert_eq!(block_exp(&[-4.0, 2.0]), 3);
        assert_eq!(block_exp(&[0.0, -0.0]), i8::MIN);
        assert_eq!(block_exp(&[f32::MIN_POSITIVE]), -125);
    }

    #[test]
    fn infinities_and_nan_are_named() {
        assert_eq!(
            check_finite(&[1.0, f32::NAN]).unwrap_err().to_string(),
            "gradient element 1 is NaN, which cannot be summed"
        );
        assert!(check_finite(&[1.0, -3.0]).is_ok());
    }

    #[test]
    fn a_rebased_result_decodes_to_the_same_floats() {
        let acc = vec![123_456_789, -98_765, 0, 1 << 28];
        for (from, to) in [(3u16, 2u16), (8, 3), (2, 2), (64, 1)] {
            let (e, v) = rebase(5, &acc, from, to);
            assert_eq!(v, acc, "{from} -> {to}: moving the exponent is enough");
            assert_eq!(dequantize(&v, e, to), dequantize(&acc, 5, from));
        }
        assert_eq!(rebase(i8::MIN, &[0, 0], 4, 2), (i8::MIN, vec![0, 0]));
        // Past i8's range the values move instead; still the same floats where they fit.
        let (e, v) = rebase(127, &[1 << 10], 4, 2);
        assert_eq!((e, v.as_slice()), (127, &[1 << 11][..]));
        let (e, v) = rebase(-127, &[1 << 10], 2, 4);
        assert_eq!((e, v.as_slice()), (-127, &[1 << 9][..]));
        assert_eq!(dequantize(&v, e, 4), dequantize(&[1 << 10], -127, 2));
    }

    proptest! {
        /// Any arrival order stays within the bound of the exact sum, and never overflows.
        #[test]
        fn sums_stay_within_the_bound(
            chunks in proptest::collection::vec(
                proptest::collection::vec(-1e6f32..1e6, 8), 1..9),
            scale_pow in proptest::collection::vec(-20i32..20, 9),
        ) {
            let n = u16::try_from(chunks.len()).unwrap();
            let inputs: Vec<Vec<f32>> = chunks.iter().zip(&scale_pow)
                .map(|(c, p)| c.iter().map(|v| v * 2f32.powi(*p)).collect())
                .collect();
            let mut acc = vec![0i32; 8];
            let mut acc_exp = i8::MIN;
            for (i, x) in inputs.iter().enumerate() {
                let (e, q) = quantize(x, n);
                prop_assert!(q.iter().all(|v| i64::from(*v).abs() <= 1i64 << frac_bits(n)));
                if i == 0 { acc = q; acc_exp = e; } else { add_into(&mut acc, &mut acc_exp, &q, e); }
            }
            let out = dequantize(&acc, acc_exp, n);
            let bound = error_bound(n, acc_exp);
            for (j, got) in out.iter().enumerate() {
                let exact: f64 = inputs.iter().map(|x| f64::from(x[j])).sum();
                let slack = bound + f64::from(got.abs()) * f64::from(f32::EPSILON);
                prop_assert!((f64::from(*got) - exact).abs() <= slack,
                    "element {}: got {}, exact {}, bound {}", j, got, exact, slack);
            }
        }
    }
}
