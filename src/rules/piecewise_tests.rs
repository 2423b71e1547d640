//! The piecewise parse of [`Rules::parse`] against the whole-document parse it replaced.
use super::*;

/// The rules as the whole-document parse read them (the code before the piecewise parse),
/// or its error message.
fn whole(text: &str) -> Result<Rules, String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        symbols: Entries,
    }
    let file: File = parse_toml(text).map_err(|(_, why)| why)?;
    let mut pairs = Vec::new();
    let mut scratch = Vec::new();
    for (symbol, list) in file.symbols {
        thresholds(&symbol, list, &mut scratch).map_err(|(_, why)| why)?;
        pairs.push((symbol.into_inner(), scratch.clone()));
    }
    Ok(Rules::from_pairs(pairs))
}

/// Parses `text` whole, in the shipped pieces and cut at every statement: all three accept
/// the same rules, or all three refuse, the two piecewise ones at the same line. (A symbol
/// listed twice within one piece is `toml`'s "duplicate key", across pieces ours.)
fn same(text: &str) -> Result<Rules, (usize, String)> {
    let expected = whole(text);
    let [cut, shipped] = [1, split::BODY_BYTES].map(|body_bytes| {
        let r = Rules::parse_in_pieces(text, "x", body_bytes).map_err(|e| match e {
            RulesError::Invalid { line, reason, .. } => (line, reason),
            e => panic!("{e}"),
        });
        assert_eq!(
            r.as_ref().ok(),
            expected.as_ref().ok(),
            "{text:?} in pieces of {body_bytes}: {r:?}, whole: {expected:?}"
        );
        r
    });
    if let (Err(a), Err(b)) = (&cut, &shipped) {
        assert_eq!(a.0, b.0, "{text:?}: {a:?} {b:?}");
    }
    cut
}

#[test]
fn every_form_the_whole_parse_accepts_reads_the_same() {
    let one = Rules::from_pairs([("A", vec![Decimal::ONE, Decimal::TWO])]);
    for text in [
        "[symbols]\nA = [\"1\", 2]\n",
        "[symbols]\r\nA = [\"1\", 2]\r\n",
        "\u{feff}[symbols]\nA = [1, 2]",
        "# rules\n\n  [ symbols ]   # the table\n\n\"A\" = [ # one\n  '1',\n  # two\n  2,\n]\n",
        r#"["symbols"]
'A' = ["""1""", '''2''']
"#,
        r#"[symbols]
A = ["""
1""", '''
2''']
"#,
        "symbols = { A = [1, 2] }\n",
        "symbols.A = [1, 2]\n",
        "[symbols]\nA = [+1, 0x2]\n",
        r#"[symbols]
A = ["\u0031", 2]
"#,
    ] {
        assert_eq!(same(text).as_ref(), Ok(&one), "{text:?}");
    }
    let three = same("[symbols]\nC = [3]\nA = [1]\n\"B\" = [\n2]\n").unwrap();
    assert_eq!(three.symbols().collect::<Vec<_>>(), ["A", "B", "C"]);
    assert_eq!(three.thresholds("B"), Some(&[Decimal::TWO][..]));
    assert_eq!(same("[symbols]\n").map(|r| r.len()), Ok(0));
}

#[test]
fn what_the_whole_parse_refuses_is_refused_with_its_line() {
    for (text, line, why) in [
        ("", 1, "missing field `symbols`"),
        ("# nothing\n", 1, "missing field `symbols`"),
        (
            "[symbols]\nA = [1]\n[symbols]\nB = [2]\n",
            3,
            "defined twice",
        ),
        ("symbols.A = [1]\n[symbols]\nB = [2]\n", 2, "defined twice"),
        ("symbols = {}\n[symbols]\n", 2, ""),
        (
            "[symbols]\nA = [1]\nB = [2]\nA = [3]\n",
            4,
            "A is listed twice (first on line 2)",
        ),
        ("[symbols]\nA = [1]\n\"A\" = [3]\n", 3, "A"),
        ("[symbols]\nA = [1]\n[other]\nx = 1\n", 3, "other"),
        ("[symbols]\nA = [1]\n[symbols.B]\n", 3, ""),
        ("[[symbols]]\nA = [1]\n", 1, ""),
        ("[symbols]\nA.x = [1]\n", 2, ""),
        ("[symbols]\nA = 1\n", 2, ""),
        ("[symbols]\nA = [1]\nB = [\"1\n\"]\n", 3, ""),
        ("[symbols]\nA = [1]\nB = [1\nC = [2]\n", 3, ""),
        ("[symbols]\nA = [1]\nB = '''1\n", 3, ""),
        ("x = 1\n[symbols]\nA = [1]\n", 1, "x"),
    ] {
        let (l, reason) = same(text).unwrap_err();
        assert!(reason.contains(why), "{text:?}: {reason}");
        // A syntax error may be reported a line from where it starts.
        assert!(
            l.abs_diff(line) <= 1,
            "{text:?}: line {l}, not {line}: {reason}"
        );
    }
}

#[test]
fn mistakes_deep_into_a_large_file_name_their_line() {
    // 50,000 rules (2.4 MB, 40 pieces) as `tick-gen` writes them.
    let rules = Rules::from_pairs((0..50_000i64).map(|i| {
        let t = vec![Decimal::from(i + 1), Decimal::new(i * 100 + 50, 2)];
        (format!("S{i:06}"), t)
    }));
    let text = rules.to_toml();
    assert_eq!(Rules::parse(&text, "x").unwrap(), rules);
    let lines: Vec<&str> = text.lines().collect();
    // The mistake replaces line AT: (mistake, line reported, reason).
    const AT: usize = 45_002;
    for (mistake, line_reported, why) in [
        ("S044999 = [1.5]", AT, "float"),
        ("S044999 = [\"1\", 1]", AT, "listed twice"),
        ("s044999 = [1]", AT, "must be 1 to 32 bytes"),
        (
            "S000001 = [1]",
            AT,
            "S000001 is listed twice (first on line 4)",
        ),
        // `toml` finds these where the next line starts, as it did parsing the whole.
        ("S044999 = [\"1]", AT + 1, "missing comma"),
        ("S044999 = [1", AT + 1, "missing comma"),
        ("[symbols]", AT, "defined twice (first on line 2)"),
        ("[other]", AT, "unknown field `other`"),
    ] {
        let mut lines = lines.clone();
        lines[AT - 1] = mistake;
        match Rules::parse(&lines.join("\n"), "big.toml").unwrap_err() {
            RulesError::Invalid { path, line, reason } => {
                assert_eq!(path, "big.toml");
                assert!(reason.contains(why), "{mistake}: {reason}");
                assert_eq!(line, line_reported, "{mistake}: {reason}");
            }
            e => panic!("{e}"),
        }
    }
}
