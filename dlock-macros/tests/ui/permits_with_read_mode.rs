use dlock::distributed_lock;

#[derive(Debug)]
struct AppError;

impl From<dlock::Error> for AppError {
    fn from(_: dlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(group = "export", permits = 3, mode = "read")]
async fn export(tenant: u64) -> Result<(), AppError> { let _ = tenant; Ok(()) }

fn main() {}
