//! Runs the real examples (cargo builds examples for `cargo test`) and
//! checks their verdict lines.

use std::process::Command;

use dlock_testkit::server::example;

#[test]
fn ten_items_ten_thousand_buyers_none_oversold() {
    let output = Command::new(example("flash_sale"))
        .output()
        .expect("run flash_sale");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "flash_sale failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("sold=10 oversold=0 buyers=10000"));
    let summary = lines.next().expect("metrics summary");
    assert!(
        summary.starts_with("metrics: acquisitions=10000 wait_p50="),
        "{summary}"
    );
}

#[test]
fn a_bad_config_fails_at_startup_naming_the_field() {
    let path = dlock_testkit::server::scratch("flash-sale-bad.toml");
    std::fs::write(&path, "[engines.main]\nkind = \"redys\"\n").expect("write");
    let output = Command::new(example("flash_sale"))
        .arg("--config")
        .arg(&path)
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("engines.main.kind") && stderr.contains("redys"),
        "{stderr}"
    );
    assert!(
        output.stdout.is_empty(),
        "nothing sold before the config was checked"
    );
}

#[test]
fn the_order_service_takes_exactly_the_payments_the_balance_allows() {
    let output = Command::new(example("order_service"))
        .output()
        .expect("run order_service");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "order_service failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout.trim(), "payments_ok=500 payments_refused=500 balance=0");
}
