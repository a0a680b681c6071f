// Microbenchmarks of the device figures the profiles cite (bench/measure_h100_figures.py).
// Built for sm_90 with: nvcc --cubin -arch=sm_90 -O3 bench/h100_figures.cu -o .gpu/figures.cubin

extern "C" __global__ void pointer_chase(const unsigned* next, int warm_steps, int timed_steps,
                                         unsigned* sink, long long* cycles) {
    // one thread walks a random cycle of cache lines: each load's address depends on the last
    // load's value, so the time per step is the load-to-use latency of the level the buffer
    // fits in. The warm-up walks the whole cycle (caches and TLBs); the timed walk goes on
    // from there, so a buffer over the L2 size finds its lines evicted long ago.
    unsigned j = 0;
    for (int s = 0; s < warm_steps; ++s) j = __ldcg(next + j);
    long long start = clock64();
    for (int s = 0; s < timed_steps; ++s) j = __ldcg(next + j);
    long long stop = clock64();
    sink[0] = j;
    cycles[0] = stop - start;
}

extern "C" __global__ void stream_read(const float4* data, long long count, int passes,
                                       float* sink) {
    // every thread of a full grid reads 16-byte words, grid-strided, through L2 only (cg):
    // with the data set under the L2 size this is the L2 read bandwidth, over it DRAM's
    float acc = 0.0f;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (int p = 0; p < passes; ++p) {
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
             i += stride) {
            float4 v = __ldcg(data + i);
            acc += v.x + v.y + v.z + v.w;
        }
    }
    if (acc == 12345.678f) sink[0] = acc;  // never true for the data used; keeps the loads
}

extern "C" __global__ void empty_kernel() {}

extern "C" __global__ void spin(long long cycles, long long* sink) {
    // one thread spins for a number of SM clock cycles: the events' time gives the clock
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
    sink[0] = clock64() - start;
}

extern "C" __global__ void stream_read_unrolled(const float4* data, long long count, int passes,
                                                float* sink) {
    // stream_read with four independent 16-byte loads in flight per thread: the bandwidth,
    // not one load's latency per thread, limits it
    float acc = 0.0f;
    long long stride = (long long)gridDim.x * blockDim.x;
    float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int p = 0; p < passes; ++p) {
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
             i += 4 * stride) {
            float4 a = __ldcg(data + i);
            float4 b = i + stride < count ? __ldcg(data + i + stride) : zero;
            float4 c = i + 2 * stride < count ? __ldcg(data + i + 2 * stride) : zero;
            float4 d = i + 3 * stride < count ? __ldcg(data + i + 3 * stride) : zero;
            acc += (a.x + b.x) + (c.x + d.x) + (a.w + b.w) + (c.w + d.w);
        }
    }
    if (acc == 12345.678f) sink[0] = acc;
}

// Throughput of the u16 -> f32 conversion the dedispersion kernel runs per channel
// (cvt.rn.f32.u16 in its PTX): eight independent chains per thread, a full grid; `control`
// is the same loop with a bit cast in place of the conversion.
#define CHAINS(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7)
#define DECLARE(i) unsigned x##i = seed + threadIdx.x * 8 + i; float a##i = 0.0f;
#define CONVERT(i) a##i += (float)(unsigned short)x##i; x##i += 3;
#define CONVERT32(i) a##i += (float)x##i; x##i += 0x9e3779b9u;
#define CAST(i) a##i += __uint_as_float(x##i & 0x3fffffffu); x##i += 3;

extern "C" __global__ void convert_u16(unsigned seed, int iterations, float* out) {
    CHAINS(DECLARE)
    for (int s = 0; s < iterations; ++s) {
        CHAINS(CONVERT)
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

extern "C" __global__ void convert_control(unsigned seed, int iterations, float* out) {
    CHAINS(DECLARE)
    for (int s = 0; s < iterations; ++s) {
        CHAINS(CAST)
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

extern "C" __global__ void convert_u32(unsigned seed, int iterations, float* out) {
    CHAINS(DECLARE)
    for (int s = 0; s < iterations; ++s) {
        CHAINS(CONVERT32)
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}
