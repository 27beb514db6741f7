use super::*;
use clap::Parser;

fn parse(argv: &[&str]) -> BenchArgs {
    let mut full = vec!["bench"];
    full.extend_from_slice(argv);
    BenchCli::try_parse_from(full).expect("args").args
}

#[test]
fn plan_from_args() {
    let plan = build_plan(&parse(&["--quick", "--sizes", "0,64,4K"])).expect("plan");
    assert_eq!(plan.lat_sizes, vec![0, 64, 4096]);
    assert_eq!(plan.bw_sizes, vec![64, 4096]);
    assert_eq!(plan.bw_reps, Plan::quick().bw_reps);
    assert!(build_plan(&parse(&["--bw-sizes", "0"])).is_err());
}

#[test]
fn systems_are_validated() {
    let names = selected_systems(&parse(&["--systems", "tcp,ucx"])).expect("ok");
    assert_eq!(names, vec!["tcp", "ucx"]);
    assert!(selected_systems(&parse(&["--systems", "bogus"])).is_err());
    let default = selected_systems(&parse(&[])).expect("default");
    assert!(default.contains(&"unix".to_string()) && default.contains(&"ucx".to_string()));
    assert!(default.contains(&"libfabric".to_string()));
    let names = selected_systems(&parse(&["--systems", "libfabric-rxd"])).expect("ok");
    assert_eq!(names, vec!["libfabric-rxd"]);
    assert!(default.contains(&"udp".to_string()));
    assert!(
        !default.contains(&CLINK_TCP.to_string()),
        "not on the host by default"
    );
    let netns = selected_systems(&parse(&["--placement", "netns"])).expect("netns");
    assert!(netns.contains(&CLINK.to_string()) && netns.contains(&CLINK_TCP.to_string()));
    let named = selected_systems(&parse(&["--systems", "clink-tcp"])).expect("named");
    assert_eq!(named, vec![CLINK_TCP]);
}

#[test]
fn rma_args() {
    let args = parse(&["--rma", "--experiments", "word_rtt", "--conns", "1,2"]);
    assert_eq!(args.experiments, vec!["word_rtt"]);
    assert_eq!(args.conns, vec![1, 2]);
    assert_eq!(parse(&["--rma"]).conns, vec![1, 10, 100, 1000]);
    for bad in [
        &["--experiments", "word_rtt"][..],
        &["--conns", "5"],
        &["--rma", "--systems", "tcp"],
        &["--rma", "--placement", "netns"],
        &["--rma", "--timeout-secs", "5"],
        &["--rma", "--experiments", "nonsense"],
    ] {
        let mut full = vec!["bench"];
        full.extend_from_slice(bad);
        assert!(BenchCli::try_parse_from(&full).is_err(), "{bad:?}");
    }
    assert!(!BenchArgs::default_for_demo().rma);
}

#[test]
fn mpi_experiments_are_named_and_checked_against_the_mode() {
    let args = parse(&["--mpi", "--experiments", "bw,bw_cold"]);
    assert_eq!(args.experiments, vec!["bw", "bw_cold"]);
    assert!(check_experiments("--mpi", mpi::EXPERIMENT_NAMES, &args.experiments).is_ok());
    // A name another mode knows is refused for this one.
    let rma = parse(&["--mpi", "--experiments", "word_rtt"]);
    assert!(check_experiments("--mpi", mpi::EXPERIMENT_NAMES, &rma.experiments).is_err());
    let bw = parse(&["--rma", "--experiments", "bw"]);
    assert!(check_experiments("--rma", &rma::EXPERIMENTS, &bw.experiments).is_err());
    // The names are the table's, each once.
    let mut table: Vec<&str> = mpi::EXPERIMENTS.iter().map(|e| e.0).collect();
    table.dedup();
    assert_eq!(table, mpi::EXPERIMENT_NAMES);
}

#[test]
fn placement_args() {
    let args = parse(&["--placement", "netns", "--mtu", "1500,9000"]);
    assert_eq!(args.placement, Placement::Netns);
    assert_eq!(args.mtu, Some(vec![1500, 9000]));
    assert_eq!(parse(&[]).placement, Placement::Host);
    let mut full = vec!["bench", "--mtu", "10"];
    assert!(BenchCli::try_parse_from(&full).is_err(), "MTU below 68");
    full.truncate(1);
    assert!(BenchCli::try_parse_from(&full).is_ok());
}

#[test]
fn netns_rows_are_labelled() {
    let mut row = report::tests_support::bw_row("clink", "udp");
    let netns = |mtu| Where {
        placement: NETNS_PLACEMENT,
        mtu: Some(mtu),
        loss_pct: None,
        rate: None,
        tcp_cc: None,
    };
    label_placement(&mut row, &netns(9000));
    assert_eq!(row.system, "clink-udp");
    assert_eq!(
        (row.placement.as_str(), row.mtu),
        (NETNS_PLACEMENT, Some(9000))
    );
    let mut row = report::tests_support::bw_row("clink", "tcp-veth");
    label_placement(&mut row, &netns(1500));
    assert_eq!(row.system, "clink-tcp");
    // A pair's congestion control names its section too.
    row.tcp_cc = Some("reno".into());
    let table = report::render_table(&[row]);
    assert!(
        table.contains("veth pair, MTU 1500, TCP congestion control reno =="),
        "{table}"
    );
    let mut row = report::tests_support::bw_row("clink", "shm");
    label_placement(&mut row, &Where::of(None));
    assert_eq!(
        (row.system.as_str(), row.placement.as_str()),
        ("clink", HOST_PLACEMENT)
    );
    let mut row = report::tests_support::bw_row("tcp", "veth");
    label_placement(&mut row, &netns(1500));
    assert_eq!(row.system, "tcp");
    let mut row = report::tests_support::bw_row("clink", "udp");
    let bridge = Where {
        placement: BRIDGE_PLACEMENT,
        mtu: Some(1500),
        loss_pct: Some(1.0),
        rate: Some("1gbit".into()),
        tcp_cc: Some("cubic".into()),
    };
    label_placement(&mut row, &bridge);
    assert_eq!(row.system, "clink-udp");
    assert_eq!(
        (row.placement.as_str(), row.loss_pct, row.rate.as_deref()),
        (BRIDGE_PLACEMENT, Some(1.0), Some("1gbit"))
    );
    assert_eq!(row.tcp_cc.as_deref(), Some("cubic"));
    // It travels through JSON and names the table's section.
    let back = Row::from_json(&row.to_json()).expect("parse");
    assert_eq!(back.tcp_cc.as_deref(), Some("cubic"));
    let table = report::render_table(&[row]);
    assert!(table.contains("TCP congestion control cubic"), "{table}");
}

/// clink-tcp rows say the congestion control clink's connections ran (`CLINK_TCP_CC`),
/// the other systems' rows the namespaces'.
#[test]
fn a_clink_tcp_row_carries_its_own_congestion_control() {
    assert_eq!(own_cc(CLINK_TCP, Some(" cubic ")), Some("cubic".into()));
    assert_eq!(own_cc(CLINK_TCP, None), None);
    assert_eq!(own_cc(CLINK_TCP, Some("")), None);
    assert_eq!(own_cc("tcp", Some("cubic")), None);
    assert_eq!(own_cc("clink-udp", Some("cubic")), None);
}
