use dlock::distributed_lock;

#[derive(Debug)]
struct AppError;

impl From<dlock::Error> for AppError {
    fn from(_: dlock::Error) -> Self {
        AppError
    }
}

struct Other;
#[distributed_lock(group = "order", key = "<order_id>")]
async fn pay(order_id: u64) -> Result<u64, Other> { Ok(order_id) }

fn main() {}
