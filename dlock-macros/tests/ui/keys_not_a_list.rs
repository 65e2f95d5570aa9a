use dlock::distributed_lock;

#[derive(Debug)]
struct AppError;

impl From<dlock::Error> for AppError {
    fn from(_: dlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(group = "account", keys = "<from>")]
async fn transfer(from: u64) -> Result<(), AppError> { let _ = from; Ok(()) }

fn main() {}
