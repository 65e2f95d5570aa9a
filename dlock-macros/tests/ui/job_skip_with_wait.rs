use dlock::distributed_lock;

#[derive(Debug)]
struct AppError;

impl From<dlock::Error> for AppError {
    fn from(_: dlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(group = "jobs", if_held = "skip", wait = "5s")]
async fn report() -> Result<(), AppError> { Ok(()) }

fn main() {}
