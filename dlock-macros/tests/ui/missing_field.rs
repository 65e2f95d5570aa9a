use dlock::distributed_lock;

#[derive(Debug)]
struct AppError;

impl From<dlock::Error> for AppError {
    fn from(_: dlock::Error) -> Self {
        AppError
    }
}

struct Order { id: u64 }
#[distributed_lock(group = "order", key = "<order.idd>")]
async fn pay(order: &Order) -> Result<(), AppError> { let _ = order.id; Ok(()) }

fn main() {}
