//! tf.data service's AutoScaler rule, as a baseline: units = ⌈Σ consumer rates ÷ mean
//! per-unit throughput⌉, with per-unit throughputs beyond one standard deviation from
//! their mean replaced by their median, and growth per decision capped. No noise guard:
//! it answers every window.

use super::{Policy, Verdict};
use crate::signals::Window;

#[derive(Debug, Clone)]
pub struct TfData {
    /// The most units one decision may add.
    pub max_growth: usize,
}

impl Default for TfData {
    fn default() -> Self {
        Self { max_growth: 8 }
    }
}

/// Values further than one standard deviation from the mean become the median.
fn replace_outliers(values: &mut [f64]) {
    if values.len() < 3 {
        return;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let sd = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    for v in values.iter_mut() {
        if (*v - mean).abs() > sd {
            *v = median;
        }
    }
}

impl Policy for TfData {
    fn decide(&mut self, w: &Window, units: usize) -> Option<Verdict> {
        if !w.is_complete() {
            return None;
        }
        let mut rates = if w.unit_rates.is_empty() { vec![w.per_unit_rate()] } else { w.unit_rates.clone() };
        replace_outliers(&mut rates);
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        let q = w.consumption();
        let optimal = ((q / mean).ceil() as usize).max(1);
        let to = optimal.min(units + self.max_growth.max(1));
        (to != units).then(|| Verdict {
            to,
            reason: format!("Σ consumer rates {q:.2} ÷ mean unit throughput {mean:.2} = {optimal} units"),
        })
    }

    /// Each window is read on its own: nothing to forget.
    fn moved(&mut self, _units: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::window;

    #[test]
    fn units_are_consumption_over_mean_unit_throughput_with_capped_growth() {
        let mut p = TfData::default();
        assert_eq!(p.decide(&window(2, 2.0, 9.0), 2).map(|v| v.to), Some(5));
        assert_eq!(p.decide(&window(5, 2.0, 9.0), 5), None);
        assert_eq!(p.decide(&window(1, 1.0, 40.0), 1).map(|v| v.to), Some(9), "growth is capped");
    }

    #[test]
    fn an_outlying_unit_counts_as_the_median() {
        let mut p = TfData::default();
        let mut w = window(4, 1.0, 8.0);
        w.unit_rates = vec![2.0, 2.0, 2.0, 20.0];
        assert_eq!(p.decide(&w, 4), None, "8 ÷ 2 = 4; the 20 is an outlier");
    }
}
