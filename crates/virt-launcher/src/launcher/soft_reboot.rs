//! Soft reboot, as upstream's launcher asks libvirt for one: through the guest agent when it
//! is connected, else by the ACPI power button with the shutdown turned into a reset
//! (libvirt's "fake reboot").
//!
//! The ACPI way: QEMU is told to pause instead of exiting when the guest powers off
//! (`set-action shutdown=pause`), the power button is pressed, and when the guest's
//! `SHUTDOWN` arrives the supervisor ([`super::domain`]) resets the machine and resumes it
//! ([`reset_after_shutdown`]); the domain stays Running throughout and QEMU keeps its pid. A
//! guest that ignores the button within [`ACPI_REBOOT_TIMEOUT`] gets QEMU's usual action
//! back, so a later power-off of its own still ends the domain.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::domain::{Intent, Shared};
use super::guest_agent::GuestAgentLink;
use crate::qmp::QmpClient;

/// How long a guest may take to shut down after the power button before the reboot is given
/// up.
pub(super) const ACPI_REBOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// Asks for the reboot: the agent's `guest-shutdown` in mode `reboot` when its port is open
/// (an agent that fails to take it falls back to ACPI, as libvirt's flags allow both), else
/// the ACPI power button.
pub(super) async fn request(
    shared: &Arc<Shared>,
    agent: &GuestAgentLink,
    qmp: &Arc<QmpClient>,
) -> Result<(), String> {
    if agent.is_open() {
        match agent.reboot().await {
            Ok(()) => {
                tracing::info!("asked the guest agent to reboot the guest");
                return Ok(());
            }
            Err(error) => {
                tracing::warn!(%error, "the guest agent did not take the reboot; pressing the ACPI power button");
            }
        }
    }
    qmp.execute("set-action", Some(json!({"shutdown": "pause"})))
        .await
        .map_err(|e| e.to_string())?;
    shared.set_intent(Intent::Reboot);
    if let Err(e) = qmp.system_powerdown().await {
        restore_shutdown_action(qmp).await;
        shared.set_intent(Intent::None);
        return Err(e.to_string());
    }
    tracing::info!("pressed the ACPI power button for a soft reboot");
    let (shared, qmp) = (Arc::clone(shared), Arc::clone(qmp));
    tokio::spawn(async move {
        tokio::time::sleep(ACPI_REBOOT_TIMEOUT).await;
        if shared.intent() == Intent::Reboot {
            tracing::warn!("the guest did not shut down for the soft reboot; giving it up");
            restore_shutdown_action(&qmp).await;
            shared.set_intent(Intent::None);
        }
    });
    Ok(())
}

/// QEMU's usual action again: a guest power-off ends QEMU.
pub(super) async fn restore_shutdown_action(qmp: &QmpClient) {
    if let Err(error) = qmp
        .execute("set-action", Some(json!({"shutdown": "poweroff"})))
        .await
    {
        tracing::warn!(%error, "cannot restore QEMU's shutdown action");
    }
}

/// The guest shut down for the reboot and QEMU paused it: reset the machine and resume.
pub(super) async fn reset_after_shutdown(qmp: Arc<QmpClient>) {
    restore_shutdown_action(&qmp).await;
    if let Err(error) = qmp.system_reset().await {
        tracing::warn!(%error, "cannot reset the machine for the soft reboot");
    }
    if let Err(error) = qmp.cont().await {
        tracing::warn!(%error, "cannot resume the machine after the soft reboot");
    }
    tracing::info!("the guest was reset for its soft reboot");
}
