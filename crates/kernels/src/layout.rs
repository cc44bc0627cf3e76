//! How attention's fused projection lays out its queries, keys and values: the one description
//! of `[q | k | v]` that the kernels, the model, its cache, the optimizer's split and the
//! Hugging Face mappings read.

use std::ops::Range;

/// The columns of attention's fused q/k/v projection, `[.., q | k | v]`: the queries of
/// `n_head` heads side by side, then the keys of `n_kv_head` heads, then their values, every
/// head `head_size` wide. Query head `h` attends with key/value head `h / (n_head / n_kv_head)`,
/// as Hugging Face groups them (grouped-query attention); with `n_kv_head == n_head` every head
/// has keys and values of its own (multi-head attention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkvLayout {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_size: usize,
}

impl QkvLayout {
    /// # Panics
    /// When a count is 0 or `n_kv_head` does not divide `n_head` (the model's configuration
    /// checks both first).
    pub fn new(n_head: usize, n_kv_head: usize, head_size: usize) -> Self {
        assert!(
            n_head > 0 && n_kv_head > 0 && head_size > 0 && n_head.is_multiple_of(n_kv_head),
            "{n_kv_head} key/value heads for {n_head} query heads of {head_size}"
        );
        Self {
            n_head,
            n_kv_head,
            head_size,
        }
    }

    /// Multi-head attention over a residual stream `n_embd` wide.
    pub fn multi_head(n_head: usize, n_embd: usize) -> Self {
        Self::new(n_head, n_head, n_embd / n_head)
    }

    /// Width of the queries, and of attention's output (the heads side by side).
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_size
    }

    /// Width of the keys, and of the values.
    pub fn kv_width(&self) -> usize {
        self.n_kv_head * self.head_size
    }

    /// Width of the whole projection.
    pub fn width(&self) -> usize {
        self.q_width() + 2 * self.kv_width()
    }

    /// The widths of the queries, the keys and the values: three matrices side by side (as
    /// Muon orthogonalises them).
    pub fn widths(&self) -> [usize; 3] {
        [self.q_width(), self.kv_width(), self.kv_width()]
    }

    /// The queries' columns.
    pub fn q(&self) -> Range<usize> {
        0..self.q_width()
    }

    /// The keys' columns.
    pub fn k(&self) -> Range<usize> {
        let start = self.q_width();
        start..start + self.kv_width()
    }

    /// The values' columns.
    pub fn v(&self) -> Range<usize> {
        let start = self.q_width() + self.kv_width();
        start..start + self.kv_width()
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.n_head / self.n_kv_head
    }

    /// The key/value head that query head `h` attends with.
    pub fn kv_head(&self, h: usize) -> usize {
        h / self.group()
    }

    /// The columns of query head `h`.
    pub fn q_head(&self, h: usize) -> Range<usize> {
        self.head(self.q().start, h)
    }

    /// The columns of key head `g`.
    pub fn k_head(&self, g: usize) -> Range<usize> {
        self.head(self.k().start, g)
    }

    /// The columns of value head `g`.
    pub fn v_head(&self, g: usize) -> Range<usize> {
        self.head(self.v().start, g)
    }

    fn head(&self, start: usize, h: usize) -> Range<usize> {
        let at = start + h * self.head_size;
        at..at + self.head_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_tile_the_projection_and_heads_group_in_order() {
        let l = QkvLayout::new(6, 2, 4);
        assert_eq!(
            (l.q(), l.k(), l.v(), l.width()),
            (0..24, 24..32, 32..40, 40)
        );
        assert_eq!(l.widths(), [24, 8, 8]);
        let groups: Vec<usize> = (0..6).map(|h| l.kv_head(h)).collect();
        assert_eq!(groups, [0, 0, 0, 1, 1, 1]);
        assert_eq!(
            (l.q_head(5), l.k_head(1), l.v_head(1)),
            (20..24, 28..32, 36..40)
        );
        let mha = QkvLayout::multi_head(4, 32);
        assert_eq!((mha.width(), mha.group(), mha.kv_head(3)), (96, 1, 3));
    }
}
