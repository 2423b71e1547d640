//! The binaries over SASL/OAUTHBEARER with OIDC (client credentials) against the secured local
//! broker's OAUTH listener (`scripts/kafka.sh up --secure`), which validates tokens with Kafka's
//! own `OAuthBearerValidatorCallbackHandler` against the JWKS of a key made at `up`. A local
//! token endpoint (`price_alerts::tools::token_endpoint`) holds that key and the client secrets;
//! each test starts its own, and controls it: token lifetime, tokens the broker refuses, stopped.
//!
//! Each binary logs in as its own client id, which is its principal (`User:<sub>`), with only
//! the ACLs `scripts/acls.sh` grants its role, as with SCRAM (tests/security.rs). Every test
//! greps everything the binaries printed for every secret of the broker: SCRAM passwords, OIDC
//! client secrets, the signing key, and the wrong secrets it tried.
//!
//! scripts/test.sh starts the secured broker and sets KAFKA_SECURE_* (`scripts/kafka.sh env
//! --secure`); without them these tests fail (they never pass silently).

mod common;

use common::oidc::oidc;
use common::secure::{assert_exactly_once, run, text, Deployment, EXIT, FAILS_WITHIN};
use price_alerts::kafka::read::count_records;
use price_alerts::kafka::Isolation;
use price_alerts::oracle::verify;
use price_alerts::rules::Rules;
use price_alerts::tools::token_endpoint::Mode;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// tick-gen, alert-pipeline and alert-verify, each as its own OIDC client with exactly its
/// documented ACLs: the verifier finds 0 missing, 0 duplicate, 0 unexpected; each client got
/// its token from the endpoint, nobody was refused, and no secret appears in anything printed.
#[test]
#[ignore = "needs the secured broker: run scripts/test.sh"]
fn end_to_end_over_oauthbearer_each_binary_its_own_client() {
    let o = oidc("oidc-e2e");
    let endpoint = o.endpoint(Duration::from_secs(300));
    let d = Deployment::new(&o.scram, "oidc-e2e", 2);
    let rules_out = d.rules_path.clone();
    let (input, output) = (d.input.as_str(), d.output.as_str());
    o.scram.acls_all(&[
        d.pipeline_acls("apply", &[]),
        vec!["apply", "tick-gen", "--input", input],
        vec!["apply", "verify", "--input", input, "--output", output],
    ]);
    let tools = o.client_config("tools", &endpoint.token_url());
    let pipeline = o.client_config("pipeline", &endpoint.token_url());
    let mut printed = Vec::new();

    let mut gen = o.command(env!("CARGO_BIN_EXE_tick-gen"), &tools);
    gen.args([
        "--topic",
        input,
        "--symbols",
        "20",
        "--ticks",
        "3000",
        "--partitions",
        "2",
    ])
    .arg("--rules-out")
    .arg(&rules_out);
    let (out, _) = run(gen, EXIT);
    printed.push(("tick-gen", text(&out)));
    assert!(
        out.status.success(),
        "tick-gen as OIDC client tools: {}",
        text(&out)
    );

    let (out, _) = run(
        d.pipeline_with(&o.oauth, &pipeline, &["--exit-when-idle", "3s"]),
        EXIT,
    );
    printed.push(("alert-pipeline", text(&out)));
    assert!(
        out.status.success(),
        "alert-pipeline as OIDC client pipeline: {}",
        text(&out)
    );

    let mut verifier = o.command(env!("CARGO_BIN_EXE_alert-verify"), &tools);
    verifier
        .arg("--rules")
        .arg(&rules_out)
        .args(["--input", input, "--output", output]);
    let (out, _) = run(verifier, EXIT);
    printed.push(("alert-verify", text(&out)));
    assert!(
        out.status.success(),
        "alert-verify as OIDC client tools finds a difference: {}",
        text(&out)
    );

    let report = verify_exactly_once(&o.scram.kafka("admin"), input, output, &rules_out);

    let counts = endpoint.counts();
    for client in ["tools", "pipeline"] {
        assert!(
            counts.issued.get(client).copied().unwrap_or(0) >= 1,
            "{client} got its tokens from the endpoint: {counts:?}"
        );
    }
    assert!(counts.refused.is_empty(), "nobody refused: {counts:?}");
    eprintln!(
        "OIDC end to end: {} notifications, tokens issued {:?}",
        report.found, counts.issued
    );
    for (what, text) in &printed {
        o.assert_no_secret(what, text, &[]);
    }
}

/// A wrong client secret, and an unknown client id: the start fails within seconds, naming the
/// token endpoint's URL and the client id, never the secret (wrong or right).
#[test]
#[ignore = "needs the secured broker: run scripts/test.sh"]
fn wrong_client_secret_fails_fast_naming_the_endpoint_never_the_secret() {
    let o = oidc("oidc-wrong");
    let endpoint = o.endpoint(Duration::from_secs(300));
    let d = Deployment::new(&o.scram, "oidc-wrong", 1);
    let url = endpoint.token_url();
    let wrong = "WRONG-oidc-secret-5b1e83d0c7";
    let cases = [
        ("wrong secret", "pipeline", wrong.to_owned()),
        ("unknown client", "nobody", o.secret("pipeline")),
    ];
    for (case, client, secret) in cases {
        let config = o.config(&format!("{client}-bad"), client, &secret, &url);
        let (out, took) = run(d.pipeline_with(&o.oauth, &config, &[]), EXIT);
        let printed = text(&out);
        assert!(!out.status.success(), "{case}: the start succeeded");
        assert!(
            printed.contains(&format!("OIDC token endpoint {url}"))
                && printed.contains(&format!("client id {client}"))
                && printed.contains("invalid_client"),
            "{case}: the refusal names the endpoint, the client and the answer: {printed}"
        );
        assert!(took < FAILS_WITHIN, "{case}: failed only after {took:?}");
        o.assert_no_secret("alert-pipeline", &printed, &[wrong]);
        eprintln!(
            "refusal ({case}, {took:?}): {}",
            printed
                .lines()
                .find(|l| l.contains("token endpoint"))
                .unwrap_or_default()
        );
    }
    let counts = endpoint.counts();
    assert!(
        counts.refused.get("pipeline").copied().unwrap_or(0) >= 1
            && counts.refused.get("nobody").copied().unwrap_or(0) >= 1,
        "the endpoint refused both: {counts:?}"
    );
    assert!(counts.issued.is_empty(), "no token issued: {counts:?}");
}

/// Tokens that live 10 s, and a run four times as long: tick-gen writes at a steady rate for
/// about 40 s while the pipeline processes it, both over OAUTHBEARER. The broker re-authenticates
/// each session before its token expires (connections.max.reauth.ms on the listener), so both
/// keep working only if librdkafka refreshed their tokens: both exit 0, the output is exactly
/// once, and the endpoint issued each client a new token at least once per lifetime over the
/// whole of its run (counting tokens alone would not do: every librdkafka client of a process
/// fetches its own at start, 9 or 10 per binary here).
#[test]
#[ignore = "needs the secured broker: run scripts/test.sh"]
fn short_lived_tokens_are_refreshed_and_a_longer_run_keeps_working() {
    const LIFETIME: Duration = Duration::from_secs(10);
    let o = oidc("oidc-refresh");
    let endpoint = o.endpoint(LIFETIME);
    let d = Deployment::new(&o.scram, "oidc-refresh", 2);
    let rules_out = d.rules_path.clone();
    let (input, output) = (d.input.as_str(), d.output.as_str());
    o.scram.acls_all(&[
        d.pipeline_acls("apply", &[]),
        vec!["apply", "tick-gen", "--input", input],
        vec!["apply", "verify", "--input", input, "--output", output],
    ]);
    let tools = o.client_config("tools", &endpoint.token_url());
    let pipeline = o.client_config("pipeline", &endpoint.token_url());

    // 1,200 ticks at 30 a second: about 40 s of writing, four token lifetimes.
    let gen = tick_gen(&o, &tools, input, &rules_out, 30);
    let started = Instant::now();
    let generator = std::thread::spawn(move || run(gen, EXIT));
    // No --exit-when-idle: a pause of tick-gen's (a broker stall, a token being fetched) must
    // not look like the end of the input. With `--exit-when-idle 8s` a fresh-clone suite run saw
    // the pipeline exit 0 in the middle of the stream, and 66 of 177 notifications were never
    // made. It is stopped with SIGTERM once it has committed every tick.
    let pipeline_started = Instant::now();
    let (p, log) = spawn_logged_pipeline(&o, &d, &pipeline);
    let (gen_out, gen_ran) = generator.join().expect("tick-gen's thread");
    let gen_printed = text(&gen_out);
    assert!(
        gen_out.status.success(),
        "tick-gen with 10 s tokens: {gen_printed}"
    );
    let status = stop_once_all_committed(&o, &d, p);
    let ran = pipeline_started.elapsed();
    let pipeline_printed = std::fs::read_to_string(&log).expect("the pipeline's log");
    assert!(
        status.success(),
        "alert-pipeline with 10 s tokens, stopped by SIGTERM: {pipeline_printed}"
    );
    assert!(
        gen_ran > 3 * LIFETIME && ran > 3 * LIFETIME,
        "the runs outlived several tokens: tick-gen {gen_ran:?}, pipeline {ran:?}"
    );

    let mut verifier = o.command(env!("CARGO_BIN_EXE_alert-verify"), &tools);
    verifier
        .arg("--rules")
        .arg(&rules_out)
        .args(["--input", input, "--output", output]);
    let (out, _) = run(verifier, EXIT);
    let verify_printed = text(&out);
    assert!(out.status.success(), "alert-verify: {verify_printed}");
    let report = verify_exactly_once(&o.scram.kafka("admin"), input, output, &rules_out);

    let counts = endpoint.counts();
    // The pipeline's run: from its start to its exit (tick-gen's ends with the pipeline's input).
    let run_end = pipeline_started + ran;
    let mut widest = BTreeMap::new();
    for (client, from, to) in [
        ("pipeline", pipeline_started, run_end),
        ("tools", started, started + gen_ran),
    ] {
        let at: Vec<Instant> = counts.issued_at.get(client).cloned().unwrap_or_default();
        let during: Vec<Instant> = at.into_iter().filter(|t| *t <= to).collect();
        assert!(!during.is_empty(), "{client} got a token: {counts:?}");
        // From the first token to the end of the run, no stretch of a lifetime without a new
        // token: what librdkafka's refresh at 80 % of the lifetime gives.
        let gaps: Vec<Duration> = during
            .windows(2)
            .map(|w| w[1] - w[0])
            .chain(std::iter::once(to - during[during.len() - 1]))
            .collect();
        let max_gap = gaps.iter().max().copied().unwrap_or_default();
        assert!(
            max_gap < LIFETIME,
            "{client} went {max_gap:?} without a new token during its run, tokens live {LIFETIME:?}"
        );
        assert!(
            to - during[0] > 3 * LIFETIME && during[0] >= from,
            "{client}'s run outlived three tokens"
        );
        widest.insert(client, max_gap);
    }
    assert!(counts.refused.is_empty(), "nobody refused: {counts:?}");
    eprintln!(
        "10 s tokens: tick-gen ran {gen_ran:?}, the pipeline {ran:?} (all {:?}); tokens issued {:?}, longest stretch without a new one {widest:?}; {} notifications",
        started.elapsed(),
        counts.issued,
        report.found
    );
    eprintln!(
        "10 s tokens: pipeline log lines 'handshake failed' {}",
        pipeline_printed
            .lines()
            .filter(|l| l.contains("handshake failed"))
            .count()
    );
    for (what, text) in [
        ("alert-pipeline", &pipeline_printed),
        ("tick-gen", &gen_printed),
        ("alert-verify", &verify_printed),
    ] {
        o.assert_no_secret(what, text, &[]);
    }
}

/// Tokens the broker must refuse: signed by a key it does not trust (same kid), or expired when
/// issued. Each start fails within seconds and says why: the broker's refusal (SASL
/// authentication with mechanism and client id), or librdkafka's (an expired token, naming the
/// endpoint).
#[test]
#[ignore = "needs the secured broker: run scripts/test.sh"]
fn a_token_the_broker_refuses_or_an_expired_one_fails_clearly() {
    let o = oidc("oidc-refused");
    let endpoint = o.endpoint(Duration::from_secs(300));
    let d = Deployment::new(&o.scram, "oidc-refused", 1);
    let url = endpoint.token_url();
    let config = o.client_config("pipeline", &url);
    let cases = [
        (
            Mode::WrongKey,
            "authentication to",
            "(SASL mechanism OAUTHBEARER, user pipeline)",
        ),
        (Mode::Expired, "OIDC token endpoint", "unexpired"),
    ];
    for (mode, what, detail) in cases {
        endpoint.set_mode(mode);
        let (out, took) = run(d.pipeline_with(&o.oauth, &config, &[]), EXIT);
        let printed = text(&out);
        assert!(!out.status.success(), "{mode:?}: the start succeeded");
        assert!(
            printed.contains(what) && printed.contains(detail),
            "{mode:?}: {printed}"
        );
        assert!(took < FAILS_WITHIN, "{mode:?}: failed only after {took:?}");
        o.assert_no_secret("alert-pipeline", &printed, &[]);
        eprintln!(
            "refusal ({mode:?}, {took:?}): {}",
            printed
                .lines()
                .find(|l| l.contains(what))
                .unwrap_or_default()
        );
    }
}

/// The token endpoint down at start (it was started, so the URL was real, and stopped): the start
/// fails within seconds, naming the endpoint's URL.
#[test]
#[ignore = "needs the secured broker: run scripts/test.sh"]
fn token_endpoint_down_at_start_fails_fast_and_names_it() {
    let o = oidc("oidc-down");
    let mut endpoint = o.endpoint(Duration::from_secs(300));
    let url = endpoint.token_url();
    endpoint.stop();
    assert!(
        std::net::TcpStream::connect(url.trim_start_matches("http://").trim_end_matches("/token"))
            .is_err(),
        "the endpoint is down"
    );
    let d = Deployment::new(&o.scram, "oidc-down", 1);
    let config = o.client_config("pipeline", &url);
    let (out, took) = run(d.pipeline_with(&o.oauth, &config, &[]), EXIT);
    let printed = text(&out);
    assert!(!out.status.success(), "the start succeeded: {printed}");
    assert!(
        printed.contains(&format!("OIDC token endpoint {url}"))
            && printed.contains("client id pipeline"),
        "the failure names the endpoint: {printed}"
    );
    assert!(took < FAILS_WITHIN, "failed only after {took:?}");
    o.assert_no_secret("alert-pipeline", &printed, &[]);
    eprintln!(
        "endpoint down ({took:?}): {}",
        printed
            .lines()
            .find(|l| l.contains("token endpoint"))
            .unwrap_or_default()
    );
}

/// The provider refuses every token request for 25 s while tick-gen and the pipeline run with
/// 10 s tokens, from the pipeline's first commit on (a rotated secret, a disabled client), then issues them again: the tokens they
/// hold expire meanwhile, and the broker ends their sessions. Neither process gives up; the
/// pipeline's log names the token endpoint while it is refused, and once tokens are issued again
/// both finish, exactly once, with no secret printed.
#[test]
#[ignore = "needs the secured broker: run scripts/test.sh"]
fn tokens_refused_while_running_then_issued_again_the_run_completes_exactly_once() {
    const LIFETIME: Duration = Duration::from_secs(10);
    let o = oidc("oidc-outage");
    let endpoint = o.endpoint(LIFETIME);
    let d = Deployment::new(&o.scram, "oidc-outage", 2);
    let rules_out = d.rules_path.clone();
    let (input, output) = (d.input.as_str(), d.output.as_str());
    o.scram.acls_all(&[
        d.pipeline_acls("apply", &[]),
        vec!["apply", "tick-gen", "--input", input],
        vec!["apply", "verify", "--input", input, "--output", output],
    ]);
    let url = endpoint.token_url();
    let tools = o.client_config("tools", &url);
    let pipeline = o.client_config("pipeline", &url);
    // 1,200 ticks at 20 a second: about 60 s of writing, the outage in the middle.
    let gen = tick_gen(&o, &tools, input, &rules_out, 20);
    let generator = std::thread::spawn(move || run(gen, EXIT + Duration::from_secs(120)));
    // No --exit-when-idle: the outage (no connection, so no records) must not look like the end
    // of the input. It is stopped with SIGTERM once it has committed every tick.
    let (p, log) = spawn_logged_pipeline(&o, &d, &pipeline);
    // The outage: from 15 s into the run (both hold tokens by then), for 25 s, longer than a
    // token's lifetime and the broker's clock skew together.
    // The outage begins once both are past their start (a token refused at start stops a binary
    // at once, as the tests above show): the pipeline has committed ticks that tick-gen wrote.
    let deadline = Instant::now() + EXIT;
    while d.committed(&o.scram).iter().flatten().sum::<i64>() == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing committed before the outage"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    endpoint.set_mode(Mode::Refuse);
    let outage = Instant::now();
    std::thread::sleep(Duration::from_secs(25));
    endpoint.set_mode(Mode::Valid);
    let refused = endpoint.counts().refused;
    assert!(
        outage.elapsed() > 2 * LIFETIME,
        "the outage outlived the tokens"
    );

    let (gen_out, gen_ran) = generator.join().expect("tick-gen's thread");
    let gen_printed = text(&gen_out);
    assert!(
        gen_out.status.success(),
        "tick-gen through the outage: {gen_printed}"
    );
    let status = stop_once_all_committed(&o, &d, p);
    let pipeline_printed = std::fs::read_to_string(&log).expect("the pipeline's log");
    eprintln!(
        "outage: tick-gen ran {gen_ran:?}; refused during it {refused:?}; issued {:?}; pipeline log lines naming the endpoint {}, 'handshake failed' {}",
        endpoint.counts().issued,
        pipeline_printed.lines().filter(|l| l.contains(&url)).count(),
        pipeline_printed.lines().filter(|l| l.contains("handshake failed")).count(),
    );
    assert!(
        status.success(),
        "alert-pipeline through the outage, stopped by SIGTERM: {pipeline_printed}"
    );
    assert!(
        refused.get("pipeline").copied().unwrap_or(0) >= 1
            && refused.get("tools").copied().unwrap_or(0) >= 1,
        "both asked for a token during the outage and were refused: {refused:?}"
    );
    assert!(
        pipeline_printed.contains(&url),
        "the pipeline's log names the token endpoint while it is refused"
    );
    verify_exactly_once(&o.scram.kafka("admin"), input, output, &rules_out);
    for (what, text) in [
        ("alert-pipeline", &pipeline_printed),
        ("tick-gen", &gen_printed),
    ] {
        o.assert_no_secret(what, text, &[]);
    }
}

/// tick-gen writing 1,200 ticks of 10 symbols at `rate` a second to `input`, as the OIDC client
/// of `config`. The rules its stream is made for are written to `rules` first, by a tick-gen
/// that only does that, so a pipeline started beside the writer reads them whole; the writer
/// puts its own copy elsewhere.
fn tick_gen(
    o: &common::oidc::Oidc,
    config: &std::path::Path,
    input: &str,
    rules: &std::path::Path,
    rate: u32,
) -> std::process::Command {
    let args = |c: &mut std::process::Command| {
        c.args(["--topic", input, "--symbols", "10", "--ticks", "1200"])
            .args(["--partitions", "2"]);
    };
    let mut only = o.command(env!("CARGO_BIN_EXE_tick-gen"), config);
    args(&mut only);
    only.arg("--rules-only").arg("--rules-out").arg(rules);
    let (out, _) = run(only, EXIT);
    assert!(
        out.status.success(),
        "tick-gen --rules-only: {}",
        text(&out)
    );
    let mut gen = o.command(env!("CARGO_BIN_EXE_tick-gen"), config);
    args(&mut gen);
    gen.args(["--rate", &rate.to_string()])
        .arg("--rules-out")
        .arg(rules.with_extension("writer.toml"));
    gen
}

/// Starts alert-pipeline over OAUTHBEARER (client config `config`) without `--exit-when-idle`,
/// its output into a log file of its own, whose path is returned with it: it ends by
/// [`stop_once_all_committed`].
fn spawn_logged_pipeline(
    o: &common::oidc::Oidc,
    d: &Deployment,
    config: &std::path::Path,
) -> (common::Pipeline, std::path::PathBuf) {
    let log = std::env::temp_dir().join(format!("{}-pipeline.log", d.input));
    let mut p = d.pipeline_with(&o.oauth, config, &[]);
    let file = std::fs::File::create(&log).expect("log file");
    p.stdout(file.try_clone().expect("log file")).stderr(file);
    let p = common::Pipeline::from(p.spawn().expect("starting alert-pipeline"), "0");
    (p, log)
}

/// Once tick-gen is done: waits until the pipeline has committed every tick of the input (tick-gen
/// is not transactional, so the input's records are its offsets), then stops it with SIGTERM and
/// returns its exit status. A pipeline that runs without `--exit-when-idle` ends this way, so a
/// pause of the input is never taken for its end.
fn stop_once_all_committed(
    o: &common::oidc::Oidc,
    d: &Deployment,
    p: common::Pipeline,
) -> std::process::ExitStatus {
    let ticks = count_records(
        &o.scram.kafka("admin"),
        &d.input,
        Isolation::ReadUncommitted,
    )
    .expect("count") as i64;
    let deadline = Instant::now() + EXIT;
    while d.committed(&o.scram).iter().flatten().sum::<i64>() < ticks {
        assert!(
            Instant::now() < deadline,
            "the pipeline never committed all {ticks} ticks: {:?}",
            d.committed(&o.scram)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    p.signal("TERM");
    p.wait(EXIT)
}

/// The verifier, as the super-user, over the stream made for the rules `tick-gen` wrote to
/// `rules_out`: the stream crosses thresholds, and every crossing is notified exactly once.
/// Returns the verifier's report.
fn verify_exactly_once(
    admin: &price_alerts::kafka::KafkaConfig,
    input: &str,
    output: &str,
    rules_out: &std::path::Path,
) -> price_alerts::oracle::VerifyReport {
    let rules = Rules::load(rules_out).expect("generated rules");
    let report = verify(
        admin,
        input,
        output,
        &rules,
        price_alerts::tick::DEFAULT_MAX_TICK_BYTES,
        Default::default(),
    )
    .expect("verifier");
    assert!(report.expected > 0, "the stream crosses thresholds");
    assert_exactly_once(&report);
    report
}
