//! Pulls from a real registry (Debian's `docker-registry` on loopback): by tag and by digest,
//! the cache reused, a multi-platform index resolved to linux/amd64, a corrupted blob and a
//! missing image refused. Skips (saying why) without `docker-registry`.

use std::path::Path;

use oci_client::manifest::{ImageIndexEntry, OciImageIndex, OciManifest, Platform};
use oci_pull::push::{ImageFile, gzip_layer, push_files};
use oci_pull::{ImageReference, PullError, Puller};
use oci_spec::image::{Arch, Os};
use test_prerequisites::registry::TestRegistry;

fn registry() -> Option<TestRegistry> {
    TestRegistry::start_if_installed().unwrap_or_else(|e| panic!("{e}"))
}

fn disk(seed: u8) -> Vec<ImageFile> {
    let content: Vec<u8> = (0..(256 * 1024u32))
        .map(|i| (i % 251) as u8 ^ seed)
        .collect();
    vec![ImageFile {
        path: "disk/disk.img".into(),
        content,
    }]
}

fn reference(registry: &TestRegistry, name: &str) -> ImageReference {
    ImageReference::parse(&format!("{}/{name}", registry.host())).expect("reference")
}

fn read_disk(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("disk/disk.img")).expect("disk in the pulled image")
}

#[tokio::test]
async fn images_pull_by_tag_and_by_digest_and_share_the_cache() -> anyhow::Result<()> {
    let Some(registry) = registry() else {
        return Ok(());
    };
    let tmp = tempfile::tempdir()?;
    let tagged = reference(&registry, "guest:v1");
    push_files(&tagged, None, &disk(0)).await?;

    let puller = Puller::new(tmp.path().join("blobs"));
    let first = puller
        .pull(&tagged, None, &tmp.path().join("by-tag"), None)
        .await?;
    assert!(first.unpacked);
    assert_eq!(first.downloaded_layers, 1);
    assert_eq!(read_disk(&tmp.path().join("by-tag")), disk(0)[0].content);

    let by_digest = tagged.with_digest(&first.digest);
    let second = puller
        .pull(&by_digest, None, &tmp.path().join("by-digest"), None)
        .await?;
    assert_eq!(second.digest, first.digest);
    assert_eq!(
        second.downloaded_layers, 0,
        "the layer comes from the cache"
    );
    assert_eq!(read_disk(&tmp.path().join("by-digest")), disk(0)[0].content);

    let again = puller
        .pull(
            &tagged,
            None,
            &tmp.path().join("by-tag"),
            Some(&first.digest),
        )
        .await?;
    assert!(!again.unpacked, "an unchanged image is left alone");

    let missing = puller
        .pull(
            &reference(&registry, "missing:v1"),
            None,
            &tmp.path().join("missing"),
            None,
        )
        .await
        .expect_err("no such image");
    assert!(matches!(missing, PullError::Manifest { .. }), "{missing}");
    assert!(!tmp.path().join("missing").exists());
    Ok(())
}

#[tokio::test]
async fn a_corrupted_blob_is_refused_and_nothing_is_unpacked() -> anyhow::Result<()> {
    let Some(registry) = registry() else {
        return Ok(());
    };
    let tmp = tempfile::tempdir()?;
    let image = reference(&registry, "corrupt:v1");
    let files = disk(7);
    push_files(&image, None, &files).await?;
    let layer_digest = oci_pull::cache::sha256_of(gzip_layer(&files)?.as_slice())?;
    let stored = registry.blob_data(&layer_digest);
    let mut bytes = std::fs::read(&stored)?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&stored, bytes)?;

    let puller = Puller::new(tmp.path().join("blobs"));
    let target = tmp.path().join("image");
    let err = puller
        .pull(&image, None, &target, None)
        .await
        .expect_err("a corrupted layer must be refused");
    assert!(matches!(err, PullError::Blob { .. }), "{err:?}");
    assert!(!target.exists(), "nothing unpacked");
    assert_eq!(puller.cache().get(&layer_digest)?, None, "nothing cached");
    Ok(())
}

#[tokio::test]
async fn an_index_resolves_to_its_linux_amd64_manifest() -> anyhow::Result<()> {
    let Some(registry) = registry() else {
        return Ok(());
    };
    let tmp = tempfile::tempdir()?;
    let amd64 = reference(&registry, "multi:amd64");
    let arm64 = reference(&registry, "multi:arm64");
    push_files(&amd64, None, &disk(1)).await?;
    push_files(&arm64, None, &disk(2)).await?;

    let client = oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::Http,
        ..Default::default()
    });
    let auth = oci_client::secrets::RegistryAuth::Anonymous;
    let mut manifests = Vec::new();
    for (image, arch) in [(&arm64, Arch::ARM64), (&amd64, Arch::Amd64)] {
        let r: oci_client::Reference = image.to_string().parse()?;
        let (body, digest) = client
            .pull_manifest_raw(&r, &auth, &[oci_client::manifest::OCI_IMAGE_MEDIA_TYPE])
            .await?;
        manifests.push(ImageIndexEntry {
            media_type: oci_client::manifest::OCI_IMAGE_MEDIA_TYPE.into(),
            digest,
            size: i64::try_from(body.len())?,
            platform: Some(Platform {
                architecture: arch,
                os: Os::Linux,
                os_version: None,
                os_features: None,
                variant: None,
                features: None,
            }),
            annotations: None,
            artifact_type: None,
        });
    }
    let index = OciImageIndex {
        schema_version: 2,
        media_type: Some(oci_client::manifest::OCI_IMAGE_INDEX_MEDIA_TYPE.into()),
        manifests,
        artifact_type: None,
        annotations: None,
    };
    let multi: oci_client::Reference = format!("{}/multi:latest", registry.host()).parse()?;
    client
        .push_manifest(&multi, &OciManifest::ImageIndex(index))
        .await?;

    let puller = Puller::new(tmp.path().join("blobs"));
    let target = tmp.path().join("image");
    puller
        .pull(&reference(&registry, "multi:latest"), None, &target, None)
        .await?;
    assert_eq!(read_disk(&target), disk(1)[0].content);
    Ok(())
}

#[tokio::test]
async fn a_registry_with_basic_auth_needs_the_credentials() -> anyhow::Result<()> {
    let Some(registry) =
        TestRegistry::start_with_basic_auth_if_installed().unwrap_or_else(|e| panic!("{e}"))
    else {
        return Ok(());
    };
    let tmp = tempfile::tempdir()?;
    let image = reference(&registry, "private:v1");
    let document = format!(
        r#"{{"auths":{{"{}":{{"username":"{}","password":"{}"}}}}}}"#,
        registry.host(),
        test_prerequisites::registry::USER,
        test_prerequisites::registry::PASSWORD
    );
    let credentials = oci_pull::auth::credentials_for(document.as_bytes(), &registry.host())?;
    assert!(credentials.is_some());
    push_files(&image, credentials.as_ref(), &disk(3)).await?;

    let puller = Puller::new(tmp.path().join("blobs"));
    let denied = puller
        .pull(&image, None, &tmp.path().join("anonymous"), None)
        .await
        .expect_err("anonymous pulls are refused");
    assert!(matches!(denied, PullError::Manifest { .. }), "{denied}");
    puller
        .pull(
            &image,
            credentials.as_ref(),
            &tmp.path().join("image"),
            None,
        )
        .await?;
    assert_eq!(read_disk(&tmp.path().join("image")), disk(3)[0].content);
    Ok(())
}

/// A figure, not an assertion: how long a 64 MiB disk takes to push, to pull cold, to pull
/// again from the cache into a new directory, and to check unchanged. Ignored by default; run
/// with `cargo nextest run -p oci-pull --test registry --run-ignored only --no-capture`.
#[tokio::test]
#[ignore = "a measurement: prints pull times"]
async fn pull_times_of_a_64_mib_disk() -> anyhow::Result<()> {
    let Some(registry) = registry() else {
        return Ok(());
    };
    let tmp = tempfile::tempdir()?;
    // Pseudo-random bytes (xorshift), so gzip cannot shrink them away.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let content: Vec<u8> = (0..(64usize << 20) / 8)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()
        })
        .collect();
    let files = [ImageFile {
        path: "disk/disk.img".into(),
        content,
    }];
    let image = reference(&registry, "big:v1");
    let started = std::time::Instant::now();
    push_files(&image, None, &files).await?;
    let push = started.elapsed();
    let puller = Puller::new(tmp.path().join("blobs"));
    let started = std::time::Instant::now();
    let first = puller
        .pull(&image, None, &tmp.path().join("a"), None)
        .await?;
    let cold = started.elapsed();
    let started = std::time::Instant::now();
    puller
        .pull(&image, None, &tmp.path().join("b"), None)
        .await?;
    let cached = started.elapsed();
    let started = std::time::Instant::now();
    puller
        .pull(&image, None, &tmp.path().join("a"), Some(&first.digest))
        .await?;
    let unchanged = started.elapsed();
    println!(
        "64 MiB disk: push {:.2} s, cold pull {:.2} s, cached pull {:.2} s, unchanged check {:.3} s",
        push.as_secs_f64(),
        cold.as_secs_f64(),
        cached.as_secs_f64(),
        unchanged.as_secs_f64()
    );
    Ok(())
}
