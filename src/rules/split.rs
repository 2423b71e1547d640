//! Cuts a TOML document into pieces that the `toml` crate can parse one at a time.
//!
//! Why: `toml` builds the whole document (a token per word, a table node per key, an array per
//! list) before anything is deserialized. For a rules file of 100,000 symbols that is 80 MB of
//! heap for a 5.7 MB file, and what the allocator keeps of it pinned the process at 133 MiB.
//! Parsed a piece at a time, the parse needs memory for one piece only.
//!
//! A piece is a run of whole top-level statements (key/value pairs, table headers, comments, blank
//! lines), cut right after the newline that ends a statement:
//! - [`Kind::Root`]: everything before the first table header (usually comments);
//! - [`Kind::Header`]: one table header line, e.g. `[symbols]`, alone;
//! - [`Kind::Body`]: key/value statements under the last header, about [`BODY_BYTES`] at a time.
//!
//! Only what follows a header is cut: a file that writes its rules without the `[symbols]` header
//! (`symbols.BBCA = [...]`, or `symbols = { ... }`) is read as correctly, in one piece.
//!
//! # Why parsing the pieces is the same as parsing the document
//! Finding where a statement ends needs only strings (four kinds, with escapes in the basic ones),
//! comments and bracket depth: a newline outside strings, comments and brackets ends a statement.
//! The caller parses every piece with `toml` and refuses the file if any piece fails. Pieces are
//! cut right after newlines, and valid TOML documents concatenated after a newline form a valid
//! document, except for what only the whole can see: a key defined in two pieces, a table defined
//! twice. The caller checks those two (`Rules::parse`). So a cut in the wrong place can only make
//! a piece fail, never let a broken file through: in the worst case a valid file would be refused,
//! and the tests below hold the scanner to every string, comment and bracket form TOML has.

/// Bytes of key/value statements per [`Kind::Body`] piece (a piece ends at the first statement
/// end past this): about 1,100 rules of four thresholds, about 1 MB of `toml`'s parse tree.
pub(super) const BODY_BYTES: usize = 64 * 1024;

/// What a piece holds, which says how it is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// The statements before the first table header: keys of the root table.
    Root,
    /// One table header statement.
    Header,
    /// Key/value statements of the table named by the last header.
    Body,
}

/// A piece of the document: its kind, where it starts (byte offset) and its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece<'a> {
    pub kind: Kind,
    pub start: usize,
    pub text: &'a str,
}

/// The pieces of `text` in order; together they are exactly `text`. The first is always the
/// [`Kind::Root`] piece (empty when the document starts with a header).
pub(super) fn pieces(text: &str, body_bytes: usize) -> Pieces<'_> {
    Pieces {
        text,
        pos: 0,
        started: false,
        body_bytes,
    }
}

/// Iterator over the pieces of a document (see [`pieces`]).
pub(super) struct Pieces<'a> {
    text: &'a str,
    /// Byte offset where the next piece starts (always right after a newline, or 0).
    pos: usize,
    /// Whether the root piece was given out.
    started: bool,
    /// See [`BODY_BYTES`].
    body_bytes: usize,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = Piece<'a>;

    fn next(&mut self) -> Option<Piece<'a>> {
        let b = self.text.as_bytes();
        let start = self.pos;
        let kind = if !self.started {
            self.started = true;
            Kind::Root
        } else if start >= b.len() {
            return None;
        } else if statement(b, start).1 {
            Kind::Header
        } else {
            Kind::Body
        };
        let mut end = start;
        while end < b.len() {
            let (next, header) = statement(b, end);
            let take = match kind {
                Kind::Root | Kind::Body if header => false,
                Kind::Header => end == start,
                Kind::Body => end - start < self.body_bytes,
                Kind::Root => true,
            };
            if !take {
                break;
            }
            end = next;
        }
        self.pos = end;
        // `end` is right after an ASCII newline or at the end, so it is a char boundary.
        Some(Piece {
            kind,
            start,
            text: &self.text[start..end],
        })
    }
}

/// The statement starting at `from`: the offset right after the newline that ends it (or the end
/// of the text), and whether it is a table header.
fn statement(b: &[u8], from: usize) -> (usize, bool) {
    let mut i = from;
    // A byte order mark may open the document; TOML does not count it as content.
    if i == 0 && b.starts_with(b"\xEF\xBB\xBF") {
        i = 3;
    }
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\r') {
        i += 1;
    }
    // A key never starts with `[`, so at the start of a statement it opens a header.
    let header = b.get(i) == Some(&b'[');
    let mut depth = 0usize;
    while i < b.len() {
        match b[i] {
            b'\n' if depth == 0 => return (i + 1, header),
            b'#' => i = end_of_comment(b, i),
            b'"' | b'\'' => i = end_of_string(b, i),
            b'[' | b'{' => {
                depth += 1;
                i += 1;
            }
            // In a valid document brackets balance; saturating keeps a broken one scanning.
            b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            _ => i += 1,
        }
    }
    (b.len(), header)
}

/// The newline that ends the comment at `i` (not consumed), or the end of the text.
fn end_of_comment(b: &[u8], i: usize) -> usize {
    b[i..]
        .iter()
        .position(|&c| c == b'\n')
        .map_or(b.len(), |n| i + n)
}

/// The offset right after the string that opens at `i` (`"`, `'`, `"""` or `'''`). Only basic
/// strings (`"`) have escapes. A single-line string also stops at a newline, which TOML does not
/// allow in it: the piece then fails to parse, as the document would.
fn end_of_string(b: &[u8], i: usize) -> usize {
    let q = b[i];
    let escapes = q == b'"';
    if b[i + 1..].starts_with(&[q, q]) {
        let mut j = i + 3;
        while j < b.len() {
            if escapes && b[j] == b'\\' {
                j += 2;
            } else if b[j..].starts_with(&[q, q, q]) {
                // Up to two quotes right before the closing three belong to the string
                // (`"""a"""""` is `a""`): the string ends after the whole run.
                while j < b.len() && b[j] == q {
                    j += 1;
                }
                return j;
            } else {
                j += 1;
            }
        }
        return b.len();
    }
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            c if c == q => return j + 1,
            b'\\' if escapes => j += 2,
            b'\n' => return j,
            _ => j += 1,
        }
    }
    b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (kind, text) of each piece, with a tiny body size so every statement is a piece.
    fn cut(text: &str) -> Vec<(Kind, &str)> {
        let all: Vec<Piece> = pieces(text, 1).collect();
        assert_eq!(
            all.iter().map(|p| p.text).collect::<String>(),
            text,
            "the pieces are the text"
        );
        for p in &all {
            assert_eq!(&text[p.start..p.start + p.text.len()], p.text);
        }
        all.into_iter().map(|p| (p.kind, p.text)).collect()
    }

    #[test]
    fn headers_and_statements_are_cut_after_their_newline() {
        use Kind::*;
        assert_eq!(
            cut("# rules\n[symbols]\nA = [1]\n\"B\" = ['2'] # c\n"),
            vec![
                (Root, "# rules\n"),
                (Header, "[symbols]\n"),
                (Body, "A = [1]\n"),
                (Body, "\"B\" = ['2'] # c\n"),
            ]
        );
        assert_eq!(
            cut("[symbols]\nA = [1]"),
            vec![(Root, ""), (Header, "[symbols]\n"), (Body, "A = [1]")]
        );
        assert_eq!(
            cut("  [ symbols ] # x\r\n\r\nA=[1]\r\n[other]\n"),
            vec![
                (Root, ""),
                (Header, "  [ symbols ] # x\r\n"),
                (Body, "\r\n"),
                (Body, "A=[1]\r\n"),
                (Header, "[other]\n"),
            ]
        );
        assert_eq!(cut(""), vec![(Root, "")]);
        assert_eq!(
            cut("\u{feff}[symbols]\n"),
            vec![(Root, ""), (Header, "\u{feff}[symbols]\n")]
        );
    }

    #[test]
    fn multi_line_arrays_and_inline_tables_stay_whole() {
        use Kind::*;
        let text = "[symbols]\nA = [\n  \"1\", # one\n  [2],\n  { x = 3 },\n]\nB = { y = [\n1] }\n";
        assert!(toml::from_str::<toml::Table>(text).is_ok());
        assert_eq!(
            cut(text),
            vec![
                (Root, ""),
                (Header, "[symbols]\n"),
                (Body, "A = [\n  \"1\", # one\n  [2],\n  { x = 3 },\n]\n"),
                (Body, "B = { y = [\n1] }\n"),
            ]
        );
    }

    #[test]
    fn brackets_quotes_and_hashes_inside_strings_and_comments_do_not_count() {
        use Kind::*;
        for body in [
            "A = [\"]\\\"[#\\\\\", 1]\n",
            "A = ['[\\', 1]\n",
            "A = [\"\"\"\n]\n[x]\\\"\"\"\"\"\", 1]\n",
            "A = ['''\n]'' '\n[x]''''', 1]\n",
            "A = [\"\", '', 1]\n",
            "A = [ # ] [\n1]\n",
            "\"[x]\" = [1]\n",
            "'a\"b' = [\"c'd\"]\n",
        ] {
            let text = format!("[symbols]\n{body}B = [2]\n");
            assert!(toml::from_str::<toml::Table>(&text).is_ok(), "{text}");
            assert_eq!(
                cut(&text),
                vec![
                    (Root, ""),
                    (Header, "[symbols]\n"),
                    (Body, body),
                    (Body, "B = [2]\n")
                ],
                "{body:?}"
            );
        }
    }

    #[test]
    fn a_body_piece_ends_at_the_first_statement_end_past_the_size() {
        let text = format!("[symbols]\n{}", "A = [1]\n".repeat(10));
        let all: Vec<Piece> = pieces(&text, 20).collect();
        let bodies: Vec<&str> = all
            .iter()
            .filter(|p| p.kind == Kind::Body)
            .map(|p| p.text)
            .collect();
        let three = "A = [1]\n".repeat(3);
        assert_eq!(bodies, [&three, &three, &three, "A = [1]\n"]);
    }

    #[test]
    fn broken_documents_are_still_cut_into_pieces_that_are_the_text() {
        for text in [
            "[symbols]\nA = [\"1\nB = [2]\n",
            "[symbols]\nA = [1\nB = [2]\n",
            "[symbols]\nA = 1]]\nB = [2]\n",
            "[symbols]\nA = \"\"\"\n",
            "[symbols]\nA = \"\\",
            "[symbols\nA = [1]\n",
            "A = '",
            "\"",
        ] {
            cut(text);
        }
    }
}
