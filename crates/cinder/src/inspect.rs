//! The attention inspector: every layer's and head's attention weights over a text, from the
//! same attention code that training runs ([`Gpt::forward_with_attention`]).

use std::path::Path;

use burn::prelude::*;
use cinder_model::Gpt;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::data::ids_tensor;
use crate::run::plot::{PlotError, register_font};

/// Attention weights of one text: `weights[layer][head][query][key]`, each row a causal
/// distribution over the keys (zero after the query's position, summing to 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionMaps {
    /// The text of each position's token (a character, for character models).
    #[serde(alias = "chars")]
    pub tokens: Vec<String>,
    pub weights: Vec<Vec<Vec<Vec<f32>>>>,
}

/// The tokens a head attends to most from one position.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadFocus {
    pub layer: usize,
    pub head: usize,
    /// `(key position, token, weight)`, highest weight first.
    pub top: Vec<(usize, String, f32)>,
}

impl AttentionMaps {
    /// Runs `model` over `ids` (at most `block_size` of them) and keeps its attention weights.
    /// `tokens` are the ids' texts, for labels.
    pub fn compute(model: &Gpt, ids: &[u32], tokens: Vec<String>, device: &Device) -> Self {
        let t = ids.len();
        let (_, layers) = model.forward_with_attention(ids_tensor(ids, [1, t], device));
        let weights = layers
            .into_iter()
            .map(|w| {
                let [_, h, _, _] = w.dims(); // (1, H, T, T)
                let flat = w.into_data().try_to_vec::<f32>().expect("f32 weights");
                (0..h)
                    .map(|hi| {
                        (0..t)
                            .map(|q| flat[(hi * t + q) * t..(hi * t + q + 1) * t].to_vec())
                            .collect()
                    })
                    .collect()
            })
            .collect();
        Self { tokens, weights }
    }

    /// Number of layers and of heads.
    pub fn shape(&self) -> (usize, usize) {
        (self.weights.len(), self.weights.first().map_or(0, Vec::len))
    }

    /// For the query at `position`, the `k` keys each head weighs most.
    pub fn focus(&self, position: usize, k: usize) -> Vec<HeadFocus> {
        let mut out = Vec::new();
        for (layer, heads) in self.weights.iter().enumerate() {
            for (head, rows) in heads.iter().enumerate() {
                let mut keys: Vec<(usize, String, f32)> = rows[position][..=position]
                    .iter()
                    .enumerate()
                    .map(|(j, &w)| (j, self.tokens[j].clone(), w))
                    .collect();
                keys.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
                keys.truncate(k);
                out.push(HeadFocus {
                    layer,
                    head,
                    top: keys,
                });
            }
        }
        out
    }

    /// Draws one heatmap per head (rows: layers, columns: heads) with a colour scale, and the
    /// tokens on both axes when there are few enough to read.
    pub fn draw(&self, title: &str, path: &Path) -> Result<(), PlotError> {
        register_font();
        let err = |e: &dyn std::fmt::Display| PlotError::new(path, e);
        let (layers, heads) = self.shape();
        let t = self.tokens.len();
        let panel = 300u32;
        let (bar_w, title_h) = (130u32, 40u32);
        let size = (
            heads as u32 * panel + bar_w,
            layers as u32 * panel + title_h,
        );
        let root = BitMapBackend::new(path, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let root = root
            .titled(title, ("sans-serif", 22))
            .map_err(|e| err(&e))?;
        let (grid, bar) = root.split_horizontally(heads as u32 * panel);
        let labelled = t <= 48;
        let label = |i: i32| -> String {
            usize::try_from(i)
                .ok()
                .and_then(|i| self.tokens.get(i))
                .map_or_else(String::new, |token| {
                    token.replace('\n', "↵").replace(' ', "·")
                })
        };
        for (idx, area) in grid.split_evenly((layers, heads)).iter().enumerate() {
            let (layer, head) = (idx / heads, idx % heads);
            let mut chart = ChartBuilder::on(area)
                .caption(format!("layer {layer}, head {head}"), ("sans-serif", 15))
                .margin(6)
                .x_label_area_size(if labelled { 18 } else { 0 })
                .y_label_area_size(if labelled { 18 } else { 0 })
                .build_cartesian_2d(0..t as i32, 0..t as i32)
                .map_err(|e| err(&e))?;
            if labelled {
                // Rows are drawn top-down: y = t - 1 - query.
                chart
                    .configure_mesh()
                    .disable_mesh()
                    .x_labels(t)
                    .y_labels(t)
                    .x_label_formatter(&|&x| label(x))
                    .y_label_formatter(&|&y| label(t as i32 - 1 - y))
                    .label_style(("sans-serif", 10))
                    .draw()
                    .map_err(|e| err(&e))?;
            }
            let rows = &self.weights[layer][head];
            chart
                .draw_series((0..t).flat_map(|q| {
                    (0..t).map(move |k| {
                        let y = (t - 1 - q) as i32;
                        Rectangle::new(
                            [(k as i32, y), (k as i32 + 1, y + 1)],
                            colour(rows[q][k]).filled(),
                        )
                    })
                }))
                .map_err(|e| err(&e))?;
        }
        // The colour scale: weight 0 at the bottom, 1 at the top.
        let mut scale = ChartBuilder::on(&bar)
            .margin_top(30)
            .margin_bottom(30)
            .margin_right(50)
            .y_label_area_size(40)
            .build_cartesian_2d(0.0..1.0, 0.0..1.0)
            .map_err(|e| err(&e))?;
        scale
            .configure_mesh()
            .disable_mesh()
            .disable_x_axis()
            .y_labels(6)
            .y_desc("attention weight")
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(|e| err(&e))?;
        scale
            .draw_series((0..100).map(|i| {
                let v = i as f64 / 100.0;
                Rectangle::new([(0.0, v), (1.0, v + 0.01)], colour(v as f32).filled())
            }))
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))
    }
}

/// Weight 0 is white, 1 is dark blue.
fn colour(w: f32) -> RGBColor {
    let w = w.clamp(0.0, 1.0).sqrt(); // small weights stay visible
    let mix = |lo: f32, hi: f32| (lo + (hi - lo) * w) as u8;
    RGBColor(mix(255.0, 8.0), mix(255.0, 48.0), mix(255.0, 107.0))
}
