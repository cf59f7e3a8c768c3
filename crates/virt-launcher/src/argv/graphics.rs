//! Video device and VNC server (`autoattachGraphicsDevice`).
//!
//! Upstream's converter gives every domain with graphics a video device (on x86_64 `vga` with
//! 16 MiB of VGA memory, or `bochs` for EFI guests when the cluster asks for it) and a VNC
//! server listening on a unix socket in the launcher's private directory, without a password:
//! only virt-handler reaches the socket, and it is `0600` (see `qemu_process`). `-display
//! none` stays: the VNC server is the domain's only display.

use super::{Args, ArgvError, absolute, escape};
use crate::spec::{LauncherSpec, VideoModel};

/// VGA memory in MiB: upstream's `graphicsDeviceDefaultVRAM` (16384 KiB).
const VGA_MEMORY_MIB: u32 = 16;

pub(super) fn push(spec: &LauncherSpec, args: &mut Args) -> Result<(), ArgvError> {
    let Some(graphics) = &spec.graphics else {
        return Ok(());
    };
    absolute("VNC socket", &graphics.vnc_socket)?;
    let device = match graphics.video {
        VideoModel::Vga => format!("VGA,id=video0,vgamem_mb={VGA_MEMORY_MIB}"),
        VideoModel::Bochs => "bochs-display,id=video0".to_owned(),
        VideoModel::Virtio => "virtio-vga,id=video0,max_outputs=1".to_owned(),
    };
    args.push_pair("-device", device);
    args.push_pair("-vnc", format!("unix:{}", escape(&graphics.vnc_socket)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::qemu_argv;
    use super::super::tests::minimal_spec;
    use crate::spec::{Graphics, VideoModel};

    fn with_graphics(video: VideoModel, socket: &str) -> Vec<String> {
        let mut spec = minimal_spec();
        spec.graphics = Some(Graphics {
            video,
            vnc_socket: socket.to_owned(),
        });
        qemu_argv(&spec).expect("argv")
    }

    #[test]
    fn without_graphics_there_is_no_video_device_and_no_vnc_server() {
        let argv = qemu_argv(&minimal_spec()).expect("argv");
        assert!(!argv.iter().any(|a| a == "-vnc"), "{argv:?}");
        assert!(!argv.iter().any(|a| a.contains("video0")), "{argv:?}");
    }

    #[test]
    fn graphics_keep_display_none_and_listen_on_the_unix_socket() {
        let argv = with_graphics(VideoModel::Vga, "/run/p,q/vnc.sock");
        let after = |flag: &str| {
            argv.iter()
                .position(|a| a == flag)
                .map(|i| argv[i + 1].as_str())
        };
        assert_eq!(after("-display"), Some("none"));
        assert_eq!(after("-vnc"), Some("unix:/run/p,,q/vnc.sock"));
        assert!(argv.contains(&"VGA,id=video0,vgamem_mb=16".to_owned()));
    }

    #[test]
    fn each_video_model_is_its_qemu_device() {
        for (model, device) in [
            (VideoModel::Vga, "VGA,"),
            (VideoModel::Bochs, "bochs-display,"),
            (VideoModel::Virtio, "virtio-vga,"),
        ] {
            let argv = with_graphics(model, "/run/vnc.sock");
            assert!(
                argv.iter().any(|a| a.starts_with(device)),
                "{model:?}: {argv:?}"
            );
        }
    }

    #[test]
    fn a_relative_vnc_socket_is_refused() {
        let mut spec = minimal_spec();
        spec.graphics = Some(Graphics {
            video: VideoModel::Vga,
            vnc_socket: "vnc.sock".into(),
        });
        assert!(matches!(
            qemu_argv(&spec),
            Err(super::ArgvError::RelativePath {
                what: "VNC socket",
                ..
            })
        ));
    }
}
