//! The event recorder against our embedded API server: what kube-rs' `Recorder` sends (a
//! create of an `events.k8s.io/v1` Event, then a merge patch of its `series` for a repeat)
//! is accepted and reads back.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use testkit::InProcessCluster;
use virt_controller::events::{ACTION_CREATE, EventRecorder, SUCCESSFUL_CREATE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_event_is_created_and_a_repeat_becomes_a_series() -> anyhow::Result<()> {
    let cluster = InProcessCluster::start().await?;
    let recorder = EventRecorder::new(cluster.client.clone());
    let regarding = ObjectReference {
        api_version: Some("kubevirt.io/v1".into()),
        kind: Some("VirtualMachine".into()),
        name: Some("testvm".into()),
        namespace: Some("default".into()),
        uid: Some("1234".into()),
        ..Default::default()
    };
    let note = || "Started the virtual machine by creating the new virtual machine instance testvm";
    recorder
        .normal(
            &regarding,
            None,
            SUCCESSFUL_CREATE,
            ACTION_CREATE,
            note().into(),
        )
        .await;
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), "default");
    let list = events.list(&ListParams::default()).await?;
    assert_eq!(list.items.len(), 1, "one event: {list:?}");
    let event = &list.items[0];
    assert_eq!(event.reason.as_deref(), Some(SUCCESSFUL_CREATE));
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert_eq!(event.note.as_deref(), Some(note()));
    assert_eq!(event.regarding.as_ref(), Some(&regarding));
    assert_eq!(event.series, None);

    recorder
        .normal(
            &regarding,
            None,
            SUCCESSFUL_CREATE,
            ACTION_CREATE,
            note().into(),
        )
        .await;
    let list = events.list(&ListParams::default()).await?;
    assert_eq!(
        list.items.len(),
        1,
        "the repeat patches the event: {list:?}"
    );
    let series = list.items[0].series.as_ref().map(|s| s.count);
    assert_eq!(series, Some(2));
    Ok(())
}
