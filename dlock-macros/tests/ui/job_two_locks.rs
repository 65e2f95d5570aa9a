use dlock::distributed_lock;

#[derive(Debug)]
struct AppError;

impl From<dlock::Error> for AppError {
    fn from(_: dlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(group = "jobs", keys = ["<a>", "<b>"], if_held = "skip")]
async fn report(a: u32, b: u32) -> Result<(), AppError> { let _ = (a, b); Ok(()) }

fn main() {}
