use dlock::distributed_lock;

#[derive(Debug)]
struct AppError;

impl From<dlock::Error> for AppError {
    fn from(_: dlock::Error) -> Self {
        AppError
    }
}

#[distributed_lock(group = "order", key = "<order_id>")]
async fn pay(order_id: u64) -> u64 { order_id }

fn main() {}
