//! Results: every figure is measured over several runs (this machine's speed swings in
//! minute-long stretches), kept per run, and summarised by its median, min and max. A
//! [`Row`] is one measured case (e.g. "randread QD 32") with its metrics; a [`Section`] is
//! one benchmark's rows. The JSON written by `--json` is a list of sections.

use serde::{Deserialize, Serialize};

/// One metric of one case over all runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Metric {
    /// Short name ("IOPS", "avg us").
    pub name: String,
    /// Every run's value, in run order.
    pub runs: Vec<f64>,
    /// Median of `runs`.
    pub median: f64,
    /// Smallest run.
    pub min: f64,
    /// Largest run.
    pub max: f64,
}

impl Metric {
    /// A metric summarised from `runs` (empty runs give zeroes).
    pub fn new(name: &str, runs: Vec<f64>) -> Metric {
        let mut sorted = runs.clone();
        sorted.sort_by(f64::total_cmp);
        let median = match sorted.len() {
            0 => 0.0,
            n if n % 2 == 1 => sorted[n / 2],
            n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        };
        Metric {
            name: name.to_string(),
            median,
            min: sorted.first().copied().unwrap_or(0.0),
            max: sorted.last().copied().unwrap_or(0.0),
            runs,
        }
    }
}

/// One measured case.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Row {
    /// What was measured ("randread QD 32").
    pub case: String,
    /// Its metrics, in display order.
    pub metrics: Vec<Metric>,
}

/// One benchmark's results.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Section {
    /// Stable id ("wire", "inproc", "tcp", "qpairs", "cost").
    pub id: String,
    /// Heading for the table.
    pub title: String,
    /// The command line that reproduces it.
    pub command: String,
    /// Rows in order.
    pub rows: Vec<Row>,
    /// Free-form notes printed under the table.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// A metric's name and its value per run.
type Runs = (String, Vec<f64>);

/// Collects a metric's value run after run for many cases, in first-seen order.
#[derive(Debug, Default)]
pub struct Collector {
    cases: Vec<(String, Vec<Runs>)>,
}

impl Collector {
    /// Record `value` of metric `name` for `case`.
    pub fn add(&mut self, case: &str, name: &str, value: f64) {
        let index = match self.cases.iter().position(|(c, _)| c == case) {
            Some(i) => i,
            None => {
                self.cases.push((case.to_string(), Vec::new()));
                self.cases.len() - 1
            }
        };
        let metrics = &mut self.cases[index].1;
        match metrics.iter_mut().find(|(n, _)| n == name) {
            Some((_, runs)) => runs.push(value),
            None => metrics.push((name.to_string(), vec![value])),
        }
    }

    /// The rows, each metric summarised.
    pub fn rows(self) -> Vec<Row> {
        self.cases
            .into_iter()
            .map(|(case, metrics)| Row {
                case,
                metrics: metrics
                    .into_iter()
                    .map(|(name, runs)| Metric::new(&name, runs))
                    .collect(),
            })
            .collect()
    }
}

/// A number for a table: integers above 1000, else three significant digits.
pub fn format_value(v: f64) -> String {
    if v.abs() >= 1000.0 {
        format!("{:.0}", v)
    } else if v.abs() >= 100.0 {
        format!("{:.1}", v)
    } else {
        format!("{:.2}", v)
    }
}

/// The sections as markdown: one table per section, "median (min-max)" per cell.
pub fn markdown(sections: &[Section], runs_note: Option<&str>) -> String {
    let mut s = String::new();
    if let Some(note) = runs_note {
        s.push_str(note);
        s.push_str("\n\n");
    }
    for sec in sections {
        s.push_str(&format!("### {}\n\n", sec.title));
        s.push_str(&format!("`{}`\n\n", sec.command));
        let mut names: Vec<&str> = Vec::new();
        for row in &sec.rows {
            for m in &row.metrics {
                if !names.contains(&m.name.as_str()) {
                    names.push(&m.name);
                }
            }
        }
        s.push_str("| case |");
        for n in &names {
            s.push_str(&format!(" {n} |"));
        }
        s.push_str("\n|---|");
        for _ in &names {
            s.push_str("---:|");
        }
        s.push('\n');
        for row in &sec.rows {
            s.push_str(&format!("| {} |", row.case));
            for n in &names {
                match row.metrics.iter().find(|m| m.name == *n) {
                    Some(m) if m.runs.len() > 1 => s.push_str(&format!(
                        " {} ({}-{}) |",
                        format_value(m.median),
                        format_value(m.min),
                        format_value(m.max)
                    )),
                    Some(m) => s.push_str(&format!(" {} |", format_value(m.median))),
                    None => s.push_str(" |"),
                }
            }
            s.push('\n');
        }
        for note in &sec.notes {
            s.push_str(&format!("\n{note}\n"));
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_runs() {
        let m = Metric::new("x", vec![5.0, 1.0, 3.0]);
        assert_eq!((m.median, m.min, m.max), (3.0, 1.0, 5.0));
        let m = Metric::new("x", vec![4.0, 1.0, 3.0, 2.0]);
        assert_eq!(m.median, 2.5);
        assert_eq!(m.runs, vec![4.0, 1.0, 3.0, 2.0]);
    }

    #[test]
    fn collector_keeps_cases_and_metrics_in_order() {
        let mut c = Collector::default();
        for run in 0..3 {
            c.add("b", "IOPS", run as f64);
            c.add("a", "IOPS", 10.0 + run as f64);
            c.add("b", "avg us", 1.0);
        }
        let rows = c.rows();
        assert_eq!(rows[0].case, "b");
        assert_eq!(rows[0].metrics[0].median, 1.0);
        assert_eq!(rows[0].metrics[1].name, "avg us");
        assert_eq!(rows[1].metrics[0].median, 11.0);
    }

    #[test]
    fn markdown_shows_median_and_range() {
        let mut c = Collector::default();
        c.add("r", "IOPS", 1000.0);
        c.add("r", "IOPS", 3000.0);
        c.add("r", "IOPS", 2000.0);
        let md = markdown(
            &[Section {
                id: "x".into(),
                title: "T".into(),
                command: "cmd".into(),
                rows: c.rows(),
                notes: vec![],
            }],
            None,
        );
        assert!(md.contains("| r | 2000 (1000-3000) |"), "{md}");
    }
}
