//! Remote checkpoint JSON (what `RemoteLoader.load_state_dict` parses) → `RemoteState` →
//! the checks the client makes before asking the dispatcher to restart the job there.
//! Properties: nothing panics; a state serialises and parses back to itself; a state the
//! checks pass is for the job's pipeline and names only batches of its epoch, each once.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_client::proto::JobInfo;
use sluice_client::RemoteState;

fn job() -> JobInfo {
    JobInfo {
        job_id: 1,
        job_name: "fuzz".into(),
        fingerprint: "00112233445566ff".into(),
        batches_per_epoch: 6,
        samples_per_epoch: 48,
        epoch: 0,
        task_batches: 2,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(state) = serde_json::from_str::<RemoteState>(text) else { return };
    let json = serde_json::to_string(&state).expect("a state serialises");
    let back: RemoteState = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}\n{json}"));
    assert_eq!(back, state, "JSON round trip changed the state");
    let job = job();
    if state.check(&job).is_ok() {
        assert_eq!(state.fingerprint, job.fingerprint);
        assert!(state.delivered.iter().all(|&b| b < job.batches_per_epoch), "{:?}", state.delivered);
        let mut unique = state.delivered.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), state.delivered.len(), "a batch delivered twice: {:?}", state.delivered);
    }
});
