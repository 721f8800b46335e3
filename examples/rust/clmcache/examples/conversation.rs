//! A two-turn chat against clmcache: the second turn reuses the first turn's
//! KV pages. Run: CLMCACHE_PREFIX=<prefix> cargo run --example conversation
use clmcache::{AdmitOptions, Engine, EngineOptions, MemoryKind};

fn main() -> Result<(), clmcache::Error> {
    println!("clmcache {}", clmcache::version_string());
    let engine = Engine::new(&EngineOptions { memory: MemoryKind::None, ..EngineOptions::new(1024) })?;
    let tenant = AdmitOptions::salted(b"tenant-7");

    let mut conversation: Vec<i32> = (0..40).collect(); // the first user message
    for turn in 1..=3 {
        let mut seq = engine.admit_with(&conversation, &tenant)?;
        println!(
            "turn {}: {} prompt tokens, {} cached, {} to compute into slots {:?}..",
            turn,
            conversation.len(),
            seq.cached_tokens(),
            seq.slots().len(),
            seq.slots().first()
        );
        // "Decode" 12 tokens, one step at a time.
        for step in 0..12 {
            let token = 1000 * turn + step;
            seq.extend(&[token])?; // the host writes this token's K/V into the returned slot
            conversation.push(token);
        }
        seq.finish()?; // publish the conversation so far
        conversation.extend(5000 * turn..5000 * turn + 8); // the user's next message
    }
    let m = engine.metrics()?;
    println!("hit rate {:.2}, {} tokens cached in {} pages", m.hit_rate, m.cached_tokens, m.pages_used);
    Ok(())
}
