//! Turning paused state into tokens and back, whichever codec the runner uses.

use crate::codec::compress::{FrameDecoder, PACKED_FRAMES, header_len_bound};
use crate::codec::{
    ChunkedState, DecompressError, SealedCodec, SignedCodec, SignedState, TokenError, TokenHeader, TokenRejection,
    compress, decompress,
};
use crate::error::{ErrorCode, RunError};
use crate::ledger_feed::{FeedItem, FeedSender, LedgerFeed};
use crate::limits::{Limit, Limits};
use crate::outcome::Interruption;
use crate::state::{ContinuationState, Parsed, StateHead, StateParser};
use crate::store::{ClaimId, ContinuationStore, ContinuationStoreError, StoredContinuation};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How a runner turns paused state into tokens.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ContinuationCodec {
    /// HMAC-signed, self-contained tokens (readable, not confidential).
    Signed(SignedCodec),
    /// Encrypted and authenticated, self-contained tokens (confidential).
    Sealed(SealedCodec),
    /// A random key; the state lives in a store and resumes at most once.
    Stored(StoredCodec),
}

impl From<SignedCodec> for ContinuationCodec {
    fn from(codec: SignedCodec) -> Self {
        ContinuationCodec::Signed(codec)
    }
}

impl From<SealedCodec> for ContinuationCodec {
    fn from(codec: SealedCodec) -> Self {
        ContinuationCodec::Sealed(codec)
    }
}

impl From<StoredCodec> for ContinuationCodec {
    fn from(codec: StoredCodec) -> Self {
        ContinuationCodec::Stored(codec)
    }
}

/// Single-use tokens backed by a [`ContinuationStore`].
#[derive(Clone)]
pub struct StoredCodec {
    store: Arc<dyn ContinuationStore>,
    ttl: Duration,
    lease: Duration,
}

impl fmt::Debug for StoredCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredCodec").field("ttl", &self.ttl).field("lease", &self.lease).finish_non_exhaustive()
    }
}

impl StoredCodec {
    /// Tokens kept for 7 days; a resume holds its claim for at most 5 minutes
    /// before someone else may take the token over.
    pub fn new(store: Arc<dyn ContinuationStore>) -> Self {
        StoredCodec { store, ttl: Duration::from_secs(7 * 24 * 3600), lease: Duration::from_secs(300) }
    }

    /// How long a token stays resumable.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a resume may hold its claim before it must have consumed the token.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
}

/// A verified continuation, not consumed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inspection {
    /// Id of the logical run.
    pub logical_run_id: String,
    /// Who may resume it.
    pub audience: String,
    /// Unix seconds when it was issued (self-contained tokens only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issued_at: Option<u64>,
    /// Unix seconds after which it can no longer resume.
    pub expires_at: u64,
    /// The interruptions waiting for a decision.
    pub interruptions: Vec<Interruption>,
}

/// A claim on a stored token, held while a resume validates and replays.
pub(crate) struct Claim {
    store: Arc<dyn ContinuationStore>,
    key: [u8; 32],
    id: ClaimId,
    consumed: AtomicBool,
}

impl Claim {
    /// Marks the token used. Called once, right before the first host function
    /// of the resume would run.
    pub(crate) fn consume(&self, tokio: &tokio::runtime::Handle) -> Result<(), RunError> {
        tokio.block_on(self.store.consume(self.key, self.id)).map_err(store_error)?;
        self.consumed.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// [`consume`](Claim::consume) for async callers.
    pub(crate) async fn consume_async(&self) -> Result<(), RunError> {
        self.store.consume(self.key, self.id).await.map_err(store_error)?;
        self.consumed.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Gives the token back unless it was consumed.
    pub(crate) async fn release_unless_consumed(&self) {
        if !self.consumed.load(Ordering::SeqCst) {
            // A release that fails leaves the claim to expire on its own.
            let _ = self.store.release(self.key, self.id).await;
        }
    }
}

/// An opened continuation.
pub(crate) enum Opened {
    /// Decoded whole, with the claim when the token is stored.
    Whole { state: ContinuationState, claim: Option<Arc<Claim>> },
    /// Authenticated but for its state, which is still to decode (`rest`, for the caller's
    /// thread to authenticate and decode into `feed` while the worker replays).
    Streamed { feed: LedgerFeed, rest: StateStream },
}

fn rejected(reason: impl fmt::Display) -> RunError {
    RunError::protocol(format!("continuation rejected: {reason}"))
}

fn store_error(error: ContinuationStoreError) -> RunError {
    match error {
        ContinuationStoreError::Backend(message) => {
            RunError::internal(format!("the continuation store failed: {message}")).retryable(true)
        }
        // A claim is held for a while only: once it ends, or its holder gives it up, the same
        // resume can succeed.
        ContinuationStoreError::Claimed => rejected(ContinuationStoreError::Claimed).retryable(true),
        other => rejected(other),
    }
}

fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Parses a stored token: exactly 43 base64url characters encoding 32 bytes.
fn parse_key(token: &str) -> Result<[u8; 32], RunError> {
    if token.len() != 43 {
        return Err(rejected("malformed stored token"));
    }
    let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| rejected("malformed stored token"))?;
    bytes.try_into().map_err(|_| rejected("malformed stored token"))
}

fn new_key() -> Result<[u8; 32], RunError> {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| RunError::internal(format!("no randomness for a token: {e}")))?;
    Ok(key)
}

impl ContinuationCodec {
    /// Encodes `state` as a token for `audience`, issued at `now`.
    pub(crate) async fn issue(
        &self,
        state: &ContinuationState,
        audience: &str,
        limits: &Limits,
        now: SystemTime,
    ) -> Result<String, RunError> {
        let bytes = compress(&state.encode());
        let limit = limits.get(Limit::Continuation);
        let too_large = |size: usize| {
            RunError::new(
                ErrorCode::SerializationError,
                format!("the continuation is {size} bytes, over the limit of {limit}"),
            )
        };
        let within = |token: String| if token.len() as u64 > limit { Err(too_large(token.len())) } else { Ok(token) };
        match self {
            ContinuationCodec::Signed(codec) => within(codec.encode(&bytes, audience, now)),
            ContinuationCodec::Sealed(codec) => within(codec.encode(&bytes, audience, now)),
            ContinuationCodec::Stored(codec) => {
                if bytes.len() as u64 > limit {
                    return Err(too_large(bytes.len()));
                }
                let key = new_key()?;
                let record =
                    StoredContinuation { audience: audience.to_string(), expires_at: now + codec.ttl, state: bytes };
                codec.store.set(key, record).await.map_err(store_error)?;
                Ok(URL_SAFE_NO_PAD.encode(key))
            }
        }
    }

    /// Verifies `token` for `audience` at `now` and decodes its state; a stored token is claimed
    /// (its store checks its expiry by its own clock).
    ///
    /// A signed token in chunks is opened for a run that overlaps its parts
    /// ([`Opened::Streamed`]): everything but its state is authenticated here, and its state is
    /// authenticated chunk by chunk as it is decoded.
    pub(crate) async fn open(
        &self,
        token: &Arc<str>,
        audience: &str,
        limits: &Limits,
        now: SystemTime,
    ) -> Result<Opened, RunError> {
        if token.len() as u64 > limits.get(Limit::Continuation) {
            return Err(rejected("token is larger than the continuation limit"));
        }
        let decoded = match self {
            ContinuationCodec::Signed(codec) => match codec.open(token, audience, now).map_err(token_error)? {
                SignedState::Chunked(chunked) => {
                    let (feed, receiver) = LedgerFeed::new();
                    let limit = limits.usize(Limit::Continuation);
                    let rest = StateStream { token: Arc::clone(token), chunked, limit, feed };
                    return Ok(Opened::Streamed { feed: receiver, rest });
                }
                SignedState::Decoded(state) => Ok(state),
            },
            ContinuationCodec::Sealed(codec) => codec.decode(token, audience, now),
            ContinuationCodec::Stored(codec) => return open_stored(codec, token, audience, limits).await,
        };
        Ok(Opened::Whole { state: decode_state(&decoded.map_err(token_error)?, limits)?, claim: None })
    }

    /// Verifies `token` and describes it without using it (no audience is
    /// needed: inspection is for whoever holds the secret or the store).
    pub async fn inspect(&self, token: &str) -> Result<Inspection, RunError> {
        self.inspect_at(token, SystemTime::now()).await
    }

    /// [`inspect`](Self::inspect) with the time taken to be `now` (a stored token's expiry is
    /// checked by its store's clock).
    pub async fn inspect_at(&self, token: &str, now: SystemTime) -> Result<Inspection, RunError> {
        let (header, state) = match self {
            ContinuationCodec::Signed(codec) => unpack(codec.decode_unscoped(token, now))?,
            ContinuationCodec::Sealed(codec) => unpack(codec.decode_unscoped(token, now))?,
            ContinuationCodec::Stored(codec) => {
                let record = codec.store.peek(parse_key(token)?).await.map_err(store_error)?;
                let header = TokenHeader {
                    issued_at: 0,
                    expires_at: unix_seconds(record.expires_at),
                    audience: record.audience,
                    nonce: String::new(),
                };
                (header, decode_state(&record.state, &Limits::default())?)
            }
        };
        let interruptions = state.pending_interruptions().map_err(rejected)?;
        let issued_at = (!matches!(self, ContinuationCodec::Stored(_))).then_some(header.issued_at);
        Ok(Inspection {
            logical_run_id: state.logical_run_id,
            audience: header.audience,
            issued_at,
            expires_at: header.expires_at,
            interruptions,
        })
    }
}

/// The header and state of a verified self-contained token.
fn unpack(decoded: Result<(TokenHeader, Vec<u8>), TokenError>) -> Result<(TokenHeader, ContinuationState), RunError> {
    let (header, bytes) = decoded.map_err(token_error)?;
    Ok((header, decode_state(&bytes, &Limits::default())?))
}

/// Claims a stored token and decodes its state; the claim is released again
/// if the token turns out not to fit this run.
async fn open_stored(codec: &StoredCodec, token: &str, audience: &str, limits: &Limits) -> Result<Opened, RunError> {
    let key = parse_key(token)?;
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| RunError::internal(format!("no randomness for a claim: {e}")))?;
    let id = ClaimId::from_le_bytes(id);
    let record = codec.store.acquire(key, id, codec.lease).await.map_err(store_error)?;
    let claim = Arc::new(Claim { store: codec.store.clone(), key, id, consumed: AtomicBool::new(false) });
    let checked = if record.audience != audience {
        Err(rejected("token was issued for another audience"))
    } else {
        decode_state(&record.state, limits)
    };
    match checked {
        Ok(state) => Ok(Opened::Whole { state, claim: Some(claim) }),
        Err(error) => {
            claim.release_unless_consumed().await;
            Err(error)
        }
    }
}

/// Decompresses (never beyond the continuation limit) and decodes a state.
fn decode_state(bytes: &[u8], limits: &Limits) -> Result<ContinuationState, RunError> {
    let limit = limits.usize(Limit::Continuation);
    let bytes = decompress(bytes, limit).map_err(|e| token_error(e.into()))?;
    ContinuationState::decode(&bytes).map_err(rejected)
}

/// The state part of a signed token, to authenticate, decode and parse frame by frame (see
/// [`FrameDecoder`]) into a [`LedgerFeed`].
pub(crate) struct StateStream {
    token: Arc<str>,
    chunked: ChunkedState,
    /// The continuation limit: the most bytes the state may decode to.
    limit: usize,
    feed: FeedSender,
}

impl StateStream {
    /// Decodes the state into the feed: its head, each frame's entries, then the verdict on the
    /// whole state. Each chunk of the token's state part is decoded and authenticated just
    /// before a frame needs it, so nothing of a frame is used before it is authentic. Every
    /// chunk is authenticated in the end, even once nobody listens any more: returns the head,
    /// if it was read, and the token's refusal if a chunk is forged, which is then the verdict
    /// on the run whatever else failed first (as [`SignedCodec::decode`] would refuse the
    /// token before decompressing it).
    pub(crate) fn finish(self) -> (Option<StateHead>, Result<(), RunError>) {
        self.finish_forwarding(|_, _| {})
    }

    /// As [`finish`](Self::finish), also handing each stretch of the decoded state, as it is
    /// decoded, to `forward` with the state's whole length: for a worker process, which parses
    /// the state itself while it is decoded here. A stretch may be used before the chunks
    /// after it are authenticated, so only to compute what nothing trusts before the verdict.
    pub(crate) fn finish_forwarding(
        self,
        mut forward: impl FnMut(usize, &[u8]),
    ) -> (Option<StateHead>, Result<(), RunError>) {
        let StateStream { token, mut chunked, limit, feed } = self;
        let mut head = None;
        let state_len = chunked.len();
        let mut bytes = Vec::with_capacity(state_len);
        let mut decode = |chunked: &mut ChunkedState, bytes: &mut Vec<u8>| -> Result<(), RunError> {
            let mut next_chunk = |bytes: &mut Vec<u8>| chunked.next_chunk(&token, bytes).map_err(rejection);
            // Enough chunks for the compression header (the first one, but for huge limits).
            while bytes.len() < header_len_bound(limit) && next_chunk(bytes)? {}
            if bytes.first() != Some(&PACKED_FRAMES) {
                while next_chunk(bytes)? {}
            }
            let mut decoder = FrameDecoder::new(bytes, state_len, limit).map_err(decompress_error)?;
            let total = decoder.total();
            let mut parser = StateParser::new(total);
            let mut forwarded = 0;
            while let Some(end) = decoder.next_frame_end() {
                while bytes.len() < end && next_chunk(bytes)? {}
                let so_far = decoder.next_frame(bytes).map_err(decompress_error)?.unwrap_or_default();
                forward(total, &so_far[forwarded.min(so_far.len())..]);
                forwarded = so_far.len();
                let mut entries = Vec::new();
                let mut listened = true;
                parser
                    .advance(so_far, |part| match part {
                        Parsed::Head(parsed) => {
                            listened = feed.send(FeedItem::Head(parsed.clone())).is_ok();
                            head = Some(parsed);
                        }
                        Parsed::Entry(entry) => entries.push(entry),
                    })
                    .map_err(rejected)?;
                if !entries.is_empty() {
                    listened &= feed.send(FeedItem::Entries(entries)).is_ok();
                }
                if !listened {
                    return Ok(());
                }
            }
            // The frames fill the state part: every chunk is in now.
            parser.finish(&decoder.into_output()).map_err(rejected)
        };
        let verdict = decode(&mut chunked, &mut bytes);
        let authentic = authenticate_rest(&mut chunked, &token, &mut bytes);
        let _ = feed.send(FeedItem::End(authentic.clone().and(verdict)));
        (head, authentic)
    }

    /// Authenticates the whole state without decoding it, for a run that fails before it
    /// starts: the token's refusal if a chunk is forged.
    pub(crate) fn authenticate(self) -> Result<(), RunError> {
        let StateStream { token, mut chunked, .. } = self;
        let mut bytes = Vec::with_capacity(chunked.len());
        authenticate_rest(&mut chunked, &token, &mut bytes)
    }
}

/// Decodes and authenticates the chunks of `chunked` not yet done (those before are in
/// `bytes`): the token's refusal if one is forged.
fn authenticate_rest(chunked: &mut ChunkedState, token: &str, bytes: &mut Vec<u8>) -> Result<(), RunError> {
    while chunked.next_chunk(token, bytes).map_err(rejection)? {}
    Ok(())
}

/// The refusal of a token.
fn rejection(rejection: TokenRejection) -> RunError {
    token_error(rejection.into())
}

/// A decompression failure, as the rejection of the token that carried the state.
fn decompress_error(error: DecompressError) -> RunError {
    token_error(error.into())
}

fn token_error(error: TokenError) -> RunError {
    RunError::protocol(format!("{error} ({})", error.reason.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_keys_are_strict() {
        let key = [3u8; 32];
        let token = URL_SAFE_NO_PAD.encode(key);
        assert_eq!(parse_key(&token).unwrap(), key);
        for bad in [&token[..42], &format!("{token}A"), &format!("{}=", &token[..42]), "!".repeat(43).as_str()] {
            assert!(parse_key(bad).is_err(), "{bad}");
        }
        // The last character carries 4 unused bits: a non-canonical variant is refused.
        let mut chars: Vec<char> = token.chars().collect();
        chars[42] = if chars[42] == 'B' { 'C' } else { 'B' };
        let variant: String = chars.into_iter().collect();
        assert!(parse_key(&variant).is_err() || parse_key(&variant).unwrap() != key);
    }
}
