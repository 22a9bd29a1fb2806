//! End-to-end tests of the runner through its public API.

mod basics;
mod bridge;
mod bytecode;
mod common;
mod continuations;
mod events;
mod limits;
mod process;
mod sandbox;
mod stored;
mod upgrades;

mod hostile;
