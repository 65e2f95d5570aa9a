use dlock::distributed_lock;

#[derive(Debug)]
struct AppError;

impl From<dlock::Error> for AppError {
    fn from(_: dlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(group = "jobs", hold_at_most = "1m", on_lost = "ignore")]
async fn report() -> Result<(), AppError> { Ok(()) }

fn main() {}
