//! Percentiles and Markdown tables for benchmark reports.

use std::time::Duration;

/// Sorted samples with percentile accessors (nearest-rank).
#[derive(Clone, Debug, Default)]
pub struct Percentiles {
    sorted: Vec<Duration>,
}

impl Percentiles {
    pub fn of(mut samples: Vec<Duration>) -> Percentiles {
        samples.sort();
        Percentiles { sorted: samples }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// The `p`-th percentile (0–100), nearest rank; zero when empty.
    pub fn at(&self, p: f64) -> Duration {
        if self.sorted.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * self.sorted.len() as f64).ceil() as usize;
        self.sorted[rank.clamp(1, self.sorted.len()) - 1]
    }

    pub fn p50_ms(&self) -> f64 {
        self.at(50.0).as_secs_f64() * 1000.0
    }

    pub fn p99_ms(&self) -> f64 {
        self.at(99.0).as_secs_f64() * 1000.0
    }

    pub fn max_ms(&self) -> f64 {
        self.at(100.0).as_secs_f64() * 1000.0
    }
}

/// A Markdown table.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn markdown(&self) -> String {
        let mut out = format!(
            "| {} |\n|{}\n",
            self.header.join(" | "),
            "---|".repeat(self.header.len())
        );
        for row in &self.rows {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let p = Percentiles::of((1..=100).rev().map(Duration::from_millis).collect());
        assert_eq!(p.at(50.0), Duration::from_millis(50));
        assert_eq!(p.at(99.0), Duration::from_millis(99));
        assert_eq!(p.at(100.0), Duration::from_millis(100));
        assert_eq!(p.at(0.0), Duration::from_millis(1));
        assert_eq!(Percentiles::default().at(50.0), Duration::ZERO);
    }

    #[test]
    fn tables_render_as_markdown() {
        let mut t = Table::new(&["a", "b"]);
        t.row(vec!["1".into(), "2".into()]);
        assert_eq!(t.markdown(), "| a | b |\n|---|---|\n| 1 | 2 |\n");
    }
}
