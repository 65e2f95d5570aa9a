use dlock::distributed_lock;

#[derive(Debug)]
struct AppError;

impl From<dlock::Error> for AppError {
    fn from(_: dlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(group = "jobs", permits = 2, if_held = "skip")]
async fn report() -> Result<(), AppError> { Ok(()) }

fn main() {}
