// Package helm holds the tests of the relay's Helm chart (relay/). It is a
// module of its own so that the Kubernetes API types its tests decode the
// rendered objects into stay out of the relay's module and binary. The tests
// need the helm CLI that scripts/deps.sh installs, and make: they check the
// release image's build (make image, make binaries) against the Dockerfile
// and the chart's appVersion.
package helm
