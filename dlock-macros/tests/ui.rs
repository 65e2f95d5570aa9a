//! Every misuse of `#[distributed_lock]` is a compile error at the offending
//! token; the `.stderr` snapshots in `tests/ui/` hold the exact messages.

#[test]
fn misuse_is_a_compile_error_at_the_right_token() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
