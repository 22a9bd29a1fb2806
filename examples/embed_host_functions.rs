//! An order system exposing its own host functions, with typed arguments, to untrusted scripts.
//!
//! `typed` decodes each JSON argument into a Rust type and names the bad one in a catchable
//! error; a host function keeps its internal errors to itself; a refund asks for approval by
//! interrupting, and runs its effect once, keyed by the call's idempotency key.
//!
//! Run with `cargo run --example embed_host_functions`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use resumable::runner::codec::{SealedCodec, SealedCodecConfig};
use resumable::{HostError, HostFunctions, Outcome, Resolution, RunRequest, Runner, RunnerConfig};
use serde_json::json;

/// The embedding application's own data: order totals in cents, and refunds by idempotency key.
#[derive(Default)]
struct Shop {
    totals: HashMap<String, u64>,
    refunds: HashMap<String, u64>,
}

const SCRIPT: &str = r#"
const total = await shop.total("o-7");
try {
  await shop.total(42);           // wrong type: a catchable error naming the argument
} catch (e) {
  console.log("refused:", e.message);
}
const refund = await shop.refund("o-7", Math.min(total, 1000));
return { total, refund };
"#;

fn host(shop: Arc<Mutex<Shop>>) -> Result<HostFunctions, Box<dyn std::error::Error>> {
    let reader = Arc::clone(&shop);
    Ok(HostFunctions::builder()
        .typed("shop.total", ["order_id"], move |_ctx, (id,): (String,)| {
            let total = reader.lock().map(|s| s.totals.get(&id).copied()).map_err(|e| e.to_string());
            async move {
                match total {
                    Ok(Some(t)) => Ok(json!(t)),
                    Ok(None) => Err(HostError::new(format!("order {id} not found"))),
                    Err(e) => Err(HostError::internal(e)),
                }
            }
        })
        .typed("shop.refund", ["order_id", "amount"], move |ctx, (id, amount): (String, u64)| {
            let shop = Arc::clone(&shop);
            async move {
                let Some(decision) = ctx.resume() else {
                    return Err(ctx.interrupt(json!({ "kind": "refund-approval", "orderId": id, "amount": amount })));
                };
                if decision.resolution != json!(true) {
                    return Ok(json!({ "approved": false }));
                }
                let mut shop = shop.lock().map_err(HostError::internal)?;
                // Keyed by the call: a retried resume cannot refund twice.
                shop.refunds.entry(ctx.idempotency_key()).or_insert(amount);
                Ok(json!({ "approved": true, "refunded": amount }))
            }
        })
        .build()?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let shop = Arc::new(Mutex::new(Shop::default()));
    shop.lock().map_err(|e| e.to_string())?.totals.insert("o-7".into(), 4_990);
    let host = host(Arc::clone(&shop))?;

    // Sealed continuations: the paused state is encrypted, so a token reveals nothing.
    let codec = SealedCodec::new(SealedCodecConfig::new(vec![9u8; 32]))?;
    let runner = Runner::new(RunnerConfig::new().workers(1).codec(codec))?;

    let Outcome::Interrupted(paused) = runner.run(RunRequest::new(SCRIPT).host(host.clone())).await? else {
        return Err("the refund should ask for approval".into());
    };
    for line in &paused.console {
        println!("[script] {}", line.text);
    }
    let asked = &paused.interruptions[0];
    println!("approval asked: {} -> {}", asked.function, asked.payload);

    let approve = [Resolution::new(asked.id.clone(), json!(true))];
    let done = runner.run(RunRequest::new(SCRIPT).host(host).resume(paused.continuation, approve)).await?;
    println!("result: {}", done.completed().map(|c| c.value.clone()).unwrap_or_default());
    println!("refunds: {:?}", shop.lock().map_err(|e| e.to_string())?.refunds);
    Ok(())
}
