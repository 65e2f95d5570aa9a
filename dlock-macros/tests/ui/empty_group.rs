use dlock::distributed_lock;

#[derive(Debug)]
struct AppError;

impl From<dlock::Error> for AppError {
    fn from(_: dlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(group = "", key = "<order_id>")]
async fn pay(order_id: u64) -> Result<(), AppError> { let _ = order_id; Ok(()) }

fn main() {}
