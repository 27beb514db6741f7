//! Pure statistics used by the harness: median, percentiles and n-half.

/// Median of `samples` (mean of the two middle values for an even count).
///
/// Returns `None` for an empty slice. NaN values are ordered last.
pub fn median(samples: &[f64]) -> Option<f64> {
    let sorted = sorted_copy(samples);
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    if n % 2 == 1 {
        Some(sorted[n / 2])
    } else {
        Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0)
    }
}

/// Percentile `p` (0 < p <= 100) of `samples` by the nearest-rank method:
/// the smallest sample such that at least `p` percent of samples are `<=` it.
///
/// Returns `None` for an empty slice or a `p` outside `(0, 100]`.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() || !(p > 0.0 && p <= 100.0) {
        return None;
    }
    let sorted = sorted_copy(samples);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let idx = rank.clamp(1, sorted.len()) - 1;
    Some(sorted[idx])
}

fn sorted_copy(samples: &[f64]) -> Vec<f64> {
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

/// The n-half point of one bandwidth curve: the message size at which half of
/// the peak bandwidth is reached.
#[derive(Debug, Clone, PartialEq)]
pub struct NHalf {
    /// Peak bandwidth over all measured sizes (same unit as the input).
    pub peak: f64,
    /// Smallest measured size whose bandwidth is at least `peak / 2`.
    pub measured_size: usize,
    /// Size where the straight line between the two neighbouring measured
    /// points crosses `peak / 2`; `None` when the smallest measured size
    /// already reaches it (the crossing lies below the measured range).
    pub interpolated_size: Option<f64>,
}

/// Computes n-half from `(size, bandwidth)` points (any order; sizes should be
/// distinct). Returns `None` when there are no points or the peak is not
/// positive.
pub fn n_half(points: &[(usize, f64)]) -> Option<NHalf> {
    let mut pts: Vec<(usize, f64)> = points
        .iter()
        .copied()
        .filter(|(_, bw)| bw.is_finite())
        .collect();
    pts.sort_by_key(|(size, _)| *size);
    let peak = pts.iter().map(|(_, bw)| *bw).fold(f64::NAN, f64::max);
    if pts.is_empty() || peak.is_nan() || peak <= 0.0 {
        return None;
    }
    let half = peak / 2.0;
    let idx = pts.iter().position(|(_, bw)| *bw >= half)?;
    let (size, bw) = pts[idx];
    let interpolated_size = if idx == 0 {
        None
    } else {
        let (s0, b0) = pts[idx - 1];
        let (s0, s1) = (s0 as f64, size as f64);
        if bw > b0 {
            Some(s0 + (half - b0) * (s1 - s0) / (bw - b0))
        } else {
            Some(s1)
        }
    };
    Some(NHalf {
        peak,
        measured_size: size,
        interpolated_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn p99_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        let w: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        assert_eq!(percentile(&w, 99.0), Some(990.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 99.0), None);
        assert_eq!(percentile(&v, 0.0), None);
        assert_eq!(percentile(&v, 101.0), None);
    }

    #[test]
    fn n_half_interpolates() {
        let pts = [(1024, 1.0), (4096, 3.0), (16384, 8.0), (65536, 10.0)];
        let nh = n_half(&pts).expect("n-half");
        assert_eq!(nh.peak, 10.0);
        assert_eq!(nh.measured_size, 16384);
        // Half peak = 5.0, between (4096, 3.0) and (16384, 8.0): 4096 + 2/5 * 12288.
        let interp = nh.interpolated_size.expect("interpolated");
        assert!((interp - (4096.0 + 0.4 * 12288.0)).abs() < 1e-9);
    }

    #[test]
    fn n_half_first_point_and_unsorted() {
        let pts = [(65536, 10.0), (4096, 6.0), (16384, 9.0)];
        let nh = n_half(&pts).expect("n-half");
        assert_eq!(nh.measured_size, 4096);
        assert_eq!(nh.interpolated_size, None);
        assert_eq!(n_half(&[]), None);
        assert_eq!(n_half(&[(4096, 0.0)]), None);
    }

    #[test]
    fn n_half_non_monotonic_curve() {
        // A dip after the peak does not matter; the first crossing counts.
        let pts = [(4096, 1.0), (16384, 10.0), (65536, 4.0)];
        let nh = n_half(&pts).expect("n-half");
        assert_eq!(nh.measured_size, 16384);
        let interp = nh.interpolated_size.expect("interpolated");
        assert!((interp - (4096.0 + 4.0 / 9.0 * 12288.0)).abs() < 1e-9);
    }
}
