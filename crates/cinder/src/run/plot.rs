//! `loss.png`: training and validation loss against iteration.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::run::metrics::Row;
use crate::run::report::{EvalReport, Observer, StepReport};
use crate::storage::names;

/// The font travels inside the binary: no system font is needed on a bare machine.
const FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// Why the plot could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw {path}: {message}")]
pub struct PlotError {
    path: String,
    message: String,
}

impl PlotError {
    pub(crate) fn new(path: &Path, message: &dyn std::fmt::Display) -> Self {
        Self {
            path: path.display().to_string(),
            message: message.to_string(),
        }
    }
}

/// Makes the bundled font the "sans-serif" of every drawing (once per process).
pub(crate) fn register_font() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// Draws the loss curves of `rows` to the PNG `path` (written beside it, then renamed).
pub fn draw(rows: &[Row], title: &str, path: &Path) -> Result<(), PlotError> {
    register_font();
    let err = |e: &dyn std::fmt::Display| PlotError::new(path, e);
    let tmp = names::tmp_png(path);
    {
        let root = BitMapBackend::new(&tmp, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let steps: Vec<(f64, f64)> = rows
            .iter()
            .map(|r| (r.iter as f64, r.train_loss as f64))
            .collect();
        let evals = |f: fn(&Row) -> Option<f32>| -> Vec<(f64, f64)> {
            rows.iter()
                .filter_map(|r| f(r).map(|v| (r.iter as f64, v as f64)))
                .collect()
        };
        let val = evals(|r| r.val_loss);
        let eval_train = evals(|r| r.eval_train_loss);
        let all = steps.iter().chain(&val).chain(&eval_train);
        let x_max = all.clone().map(|p| p.0).fold(1.0, f64::max);
        let y_max = all.clone().map(|p| p.1).fold(0.0, f64::max).max(0.1) * 1.05;
        let y_min = all.map(|p| p.1).fold(f64::INFINITY, f64::min).min(y_max) * 0.95;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max, y_min..y_max)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("iteration")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc("loss (nats per character)")
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(|e| err(&e))?;
        type Series<'a> = (&'a str, &'a Vec<(f64, f64)>, RGBColor, u32); // label, points, colour, width
        let series: [Series; 3] = [
            ("train loss (step)", &steps, RGBColor(160, 190, 230), 1),
            ("train loss (eval)", &eval_train, BLUE, 2),
            ("validation loss", &val, RED, 2),
        ];
        for (label, points, color, width) in series {
            if points.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(width),
                ))
                .map_err(|e| err(&e))?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| err(&e))
}

/// Redraws `loss.png` from the metrics file after every evaluation.
pub struct LossPlot {
    pub metrics: std::path::PathBuf,
    pub png: std::path::PathBuf,
    pub title: String,
}

impl Observer for LossPlot {
    fn step(&mut self, _s: &StepReport, eval: Option<&EvalReport>) {
        if eval.is_none() {
            return;
        }
        let drawn = crate::run::metrics::read(&self.metrics)
            .map_err(|e| e.to_string())
            .and_then(|rows| draw(&rows, &self.title, &self.png).map_err(|e| e.to_string()));
        if let Err(e) = drawn {
            eprintln!("warning: {e}");
        }
    }
}
