# One image with every gpuslice binary. Build: make image (needs a container engine).
# The device plugin needs cgo for NVML; the driver's libnvidia-ml.so is injected at run time by the
# NVIDIA container runtime (NVIDIA_DRIVER_CAPABILITIES=utility), never shipped in the image.

ARG GO_VERSION=1.26.8
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
ENV CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations
RUN go build -trimpath -tags grpcnotrace -ldflags "-s -w -X main.version=${VERSION}" -o /out/ \
      ./cmd/gpuslice-device-plugin ./cmd/gpuslice-dra-plugin ./cmd/gpuslice-scheduler ./cmd/gpuslice-webhook ./cmd/gpuslice

# glibc is needed to dlopen libnvidia-ml.so; distroless/base carries it and nothing else.
FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /out/ /usr/bin/
USER 65532:65532
ENTRYPOINT ["/usr/bin/gpuslice"]
