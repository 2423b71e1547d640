//! What the benchmarks' PNG plots share: the font and the colours.
//!
//! Text is drawn by plotters' pure-Rust `ab_glyph` path from DejaVu Sans bytes embedded by the
//! `dejavu` crate, so a plot needs neither fontconfig nor any font installed on the machine.

use anyhow::anyhow;
use plotters::style::{register_font, FontStyle, RGBColor};
use std::sync::Once;

/// One colour per series (cycled beyond six).
pub const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

static FONT: Once = Once::new();

/// Registers DejaVu Sans as plotters' "sans-serif" (once per process).
pub fn register_fonts() -> anyhow::Result<()> {
    let mut result = Ok(());
    FONT.call_once(|| {
        result = register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| anyhow!("the embedded DejaVu Sans font could not be parsed"));
    });
    result
}
