use dlock::distributed_lock;

#[derive(Debug)]
struct AppError;

impl From<dlock::Error> for AppError {
    fn from(_: dlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(group = "account", key = "<from>", keys = ["<from>", "<to>"])]
async fn transfer(from: u64, to: u64) -> Result<(), AppError> { let _ = (from, to); Ok(()) }

fn main() {}
