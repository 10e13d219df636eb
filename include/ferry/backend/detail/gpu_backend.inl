// SPDX-License-Identifier: Apache-2.0
// One implementation of the GPU backend, instantiated twice: for CUDA (cuda/backend.hpp) and HIP
// (hip/backend.hpp). The including header defines (gpu_backend_undef.inl undefines them after):
//   FERRY_GPU(name)      token-pastes the runtime prefix: FERRY_GPU(Malloc) -> cudaMalloc / hipMalloc
//   FERRY_GPU_BACKEND / _KERNEL / _TAG / _ERROR / _NAME: cuda_backend, cuda_kernel, cuda_tag, cuda_error, "cuda"
//   FERRY_GPU_TRY(call)  throws FERRY_GPU_ERROR naming the call and file:line
// and the few spellings that differ (FERRY_GPU_ATTR_*, ...). No include guard: included once by each header.

namespace ferry::backend {

struct FERRY_GPU_BACKEND {
  using tag = FERRY_GPU_TAG;
  using error_type = FERRY_GPU_ERROR;
  using stream_type = FERRY_GPU(Stream_t);
  using event_type = FERRY_GPU(Event_t);
  using graph_type = FERRY_GPU(Graph_t);
  using graph_exec_type = FERRY_GPU(GraphExec_t);
  template <class... Args>
  using kernel_type = FERRY_GPU_KERNEL<Args...>;

  static constexpr std::string_view name() noexcept { return FERRY_GPU_NAME; }

  // ---- device ------------------------------------------------------------------------------------
  [[nodiscard]] int device_count() const
  {
    int n = 0;  // left unwritten by the runtime when no driver is present
    const auto st = FERRY_GPU(GetDeviceCount)(&n);
    if (st != FERRY_GPU(Success)) {
      (void)FERRY_GPU(GetLastError)();  // clear, so a later call does not inherit it
      return 0;
    }
    return n;
  }
  [[nodiscard]] device_id current_device() const
  {
    int d = 0;
    FERRY_GPU_TRY(FERRY_GPU(GetDevice)(&d));
    return device_id{d};
  }
  void set_device(device_id d) const { FERRY_GPU_TRY(FERRY_GPU(SetDevice)(d.value)); }

  [[nodiscard]] device_attributes attributes(device_id d) const
  {
    device_attributes a;
    a.device = d;
    FERRY_GPU_DEVICE_PROP prop{};
    FERRY_GPU_TRY(FERRY_GPU(GetDeviceProperties)(&prop, d.value));
    a.name = prop.name;
    a.sm_count = prop.multiProcessorCount;
    a.compute_capability_major = prop.major;
    a.compute_capability_minor = prop.minor;
    a.total_memory = prop.totalGlobalMem;
    int v = 0;
    FERRY_GPU_TRY(FERRY_GPU(DeviceGetAttribute)(&v, FERRY_GPU_ATTR_CONCURRENT_MANAGED, d.value));
    a.concurrent_managed_access = v != 0;
    v = 0;
    FERRY_GPU_TRY(FERRY_GPU(DeviceGetAttribute)(&v, FERRY_GPU_ATTR_HOST_NATIVE_ATOMIC, d.value));
    a.host_native_atomic_supported = v != 0;
    v = 0;
    FERRY_GPU_TRY(FERRY_GPU(DeviceGetAttribute)(&v, FERRY_GPU_ATTR_PAGEABLE_ACCESS, d.value));
    a.pageable_memory_access = v != 0;
    a.stream_mem_ops_64 = FERRY_GPU_STREAM_MEM_OPS_64(d.value);
    return a;
  }

  // ---- streams -----------------------------------------------------------------------------------
  [[nodiscard]] stream_type stream_create() const
  {
    stream_type s{};
    FERRY_GPU_TRY(FERRY_GPU(StreamCreateWithFlags)(&s, FERRY_GPU(StreamNonBlocking)));
    return s;
  }
  void stream_destroy(stream_type s) const noexcept
  {
    if (s != nullptr) { (void)FERRY_GPU(StreamDestroy)(s); }
  }
  void stream_synchronize(stream_type s) const { FERRY_GPU_TRY(FERRY_GPU(StreamSynchronize)(s)); }
  [[nodiscard]] bool stream_query(stream_type s) const
  {
    const auto st = FERRY_GPU(StreamQuery)(s);
    if (st == FERRY_GPU(ErrorNotReady)) { return false; }
    FERRY_GPU_TRY(st);
    return true;
  }
  [[nodiscard]] bool stream_is_capturing(stream_type s) const
  {
    FERRY_GPU(StreamCaptureStatus) status{};
    FERRY_GPU_TRY(FERRY_GPU(StreamIsCapturing)(s, &status));
    return status != FERRY_GPU(StreamCaptureStatusNone);
  }
  /// While `s` is captured: the one graph node that work enqueued next on `s` would depend on (an opaque id
  /// valid for the capture); a hint: 0 when not capturing, with 0 or 2+ dependencies, or when the query failed.
  [[nodiscard]] std::uintptr_t capture_tail(stream_type s) const noexcept
  {
    FERRY_GPU(StreamCaptureStatus) status{};
    const FERRY_GPU(GraphNode_t)* deps = nullptr;
    std::size_t n = 0;
    if (FERRY_GPU_CAPTURE_DEPS(s, &status, &deps, &n) != FERRY_GPU(Success)) {
      (void)FERRY_GPU(GetLastError)();
      return 0;
    }
    if (status != FERRY_GPU(StreamCaptureStatusActive) || n != 1 || deps == nullptr) { return 0; }
    return reinterpret_cast<std::uintptr_t>(deps[0]);
  }

  // ---- events ------------------------------------------------------------------------------------
  [[nodiscard]] event_type event_create(event_flags flags) const
  {
    event_type e{};
    const unsigned f = (static_cast<unsigned>(flags) & static_cast<unsigned>(event_flags::disable_timing)) != 0
                         ? FERRY_GPU(EventDisableTiming)
                         : FERRY_GPU(EventDefault);
    FERRY_GPU_TRY(FERRY_GPU(EventCreateWithFlags)(&e, f));
    return e;
  }
  void event_destroy(event_type e) const noexcept
  {
    if (e != nullptr) { (void)FERRY_GPU(EventDestroy)(e); }
  }
  /// Plain record. Inside stream capture this is only a capture dependency (no graph node).
  void event_record(event_type e, stream_type s) const { FERRY_GPU_TRY(FERRY_GPU(EventRecord)(e, s)); }
  /// A record the CPU can observe also when `s` is being captured: a real event-record graph node.
  void event_record_external(event_type e, stream_type s) const
  {
    if (stream_is_capturing(s)) {
      FERRY_GPU_TRY(FERRY_GPU_EVENT_RECORD_EXTERNAL(e, s));
    } else {
      FERRY_GPU_TRY(FERRY_GPU(EventRecord)(e, s));
    }
  }
  [[nodiscard]] bool event_query(event_type e) const
  {
    const auto st = FERRY_GPU(EventQuery)(e);
    if (st == FERRY_GPU(ErrorNotReady)) { return false; }
    FERRY_GPU_TRY(st);
    return true;
  }
  void event_synchronize(event_type e) const { FERRY_GPU_TRY(FERRY_GPU(EventSynchronize)(e)); }
  [[nodiscard]] float event_elapsed_ms(event_type start, event_type end) const
  {
    float ms = 0.0F;
    FERRY_GPU_TRY(FERRY_GPU(EventElapsedTime)(&ms, start, end));
    return ms;
  }
  void stream_wait_event(stream_type s, event_type e) const { FERRY_GPU_TRY(FERRY_GPU(StreamWaitEvent)(s, e, 0)); }

  // ---- memory ------------------------------------------------------------------------------------
  [[nodiscard]] void* allocate_device(std::size_t bytes) const
  {
    void* p = nullptr;
    return allocated(FERRY_GPU(Malloc)(&p, bytes), p, "device", bytes);
  }
  void free_device(void* p) const noexcept { if (p != nullptr) { (void)FERRY_GPU(Free)(p); } }
  [[nodiscard]] void* allocate_pinned(std::size_t bytes, bool mapped) const
  {
    void* p = nullptr;
    return allocated(FERRY_GPU_HOST_ALLOC(&p, bytes, mapped ? FERRY_GPU_HOST_ALLOC_MAPPED : 0u), p, "pinned", bytes);
  }
  void free_pinned(void* p) const noexcept { if (p != nullptr) { (void)FERRY_GPU_HOST_FREE(p); } }
  [[nodiscard]] void* mapped_device_pointer(void* pinned) const
  {
    void* d = nullptr;
    FERRY_GPU_TRY(FERRY_GPU(HostGetDevicePointer)(&d, pinned, 0));
    return d;
  }
  /// Page-locks `bytes` of caller-owned host memory at `p` (e.g. a shared-memory mapping) for DMA, for every
  /// device (portable); host_unregister(p) undoes it. Registering a range twice is the runtime's error.
  void host_register(void* p, std::size_t bytes) const
  {
    FERRY_GPU_TRY(FERRY_GPU(HostRegister)(p, bytes, FERRY_GPU(HostRegisterPortable)));
  }
  void host_unregister(void* p) const noexcept
  {
    if (p != nullptr && FERRY_GPU(HostUnregister)(p) != FERRY_GPU(Success)) { (void)FERRY_GPU(GetLastError)(); }
  }
  [[nodiscard]] void* allocate_managed(std::size_t bytes) const
  {
    void* p = nullptr;
    return allocated(FERRY_GPU(MallocManaged)(&p, bytes, FERRY_GPU(MemAttachGlobal)), p, "managed", bytes);
  }
  void free_managed(void* p) const noexcept { if (p != nullptr) { (void)FERRY_GPU(Free)(p); } }
  void mem_advise(void* p, std::size_t bytes, mem_advice advice, device_id d) const
  {
    FERRY_GPU_TRY(FERRY_GPU_MEM_ADVISE(p, bytes, advice, d.value));
  }
  void memcpy_async(void* dst, const void* src, std::size_t bytes, memcpy_kind kind, stream_type s) const
  {
    FERRY_GPU(MemcpyKind) k = FERRY_GPU(MemcpyDefault);
    switch (kind) {
      case memcpy_kind::host_to_device: k = FERRY_GPU(MemcpyHostToDevice); break;
      case memcpy_kind::device_to_host: k = FERRY_GPU(MemcpyDeviceToHost); break;
      case memcpy_kind::device_to_device: k = FERRY_GPU(MemcpyDeviceToDevice); break;
      case memcpy_kind::host_to_host: k = FERRY_GPU(MemcpyHostToHost); break;
      case memcpy_kind::automatic: break;
    }
    FERRY_GPU_TRY(FERRY_GPU(MemcpyAsync)(dst, src, bytes, k, s));
  }
  void memset_async(void* dst, int value, std::size_t bytes, stream_type s) const
  {
    FERRY_GPU_TRY(FERRY_GPU(MemsetAsync)(dst, value, bytes, s));
  }
  /// Drops `keep` (the owner of memory that work enqueued on the stream reads) now: the memory's allocator
  /// orders its reuse on the stream (cudaFree synchronizes; torch's caching allocator is stream-ordered).
  void release_after(stream_type, std::shared_ptr<void> keep) const noexcept { keep.reset(); }
  /// Whether memcpy_batch_h2d_async is one runtime call (cudaMemcpyBatchAsync, CUDA 12.8+).
  [[nodiscard]] static constexpr bool batch_native() noexcept { return FERRY_GPU_BATCH_NATIVE; }
  /// `n` host-to-device copies (dsts[i] <- srcs[i], sizes[i] bytes) on `s`, sources read in stream order: one
  /// batched submission where native (then not graph-capturable), else one copy per range; n == 0: nothing.
  void memcpy_batch_h2d_async(void* const* dsts, const void* const* srcs, const std::size_t* sizes, std::size_t n,
                              device_id d, stream_type s) const
  {
    if (n == 0) { return; }
    if constexpr (batch_native()) {
      FERRY_GPU_TRY(FERRY_GPU_MEMCPY_BATCH_H2D(dsts, srcs, sizes, n, d.value, s));
    } else {
      for (std::size_t i = 0; i < n; ++i) { memcpy_async(dsts[i], srcs[i], sizes[i], memcpy_kind::host_to_device, s); }
    }
  }

  // ---- kernels -----------------------------------------------------------------------------------
  template <class... Args>
  void launch(kernel_type<Args...> k, launch_config cfg, stream_type s, std::type_identity_t<Args>... args) const
  {
    void* argv[sizeof...(Args) > 0 ? sizeof...(Args) : 1] = {static_cast<void*>(&args)...};
    const ::dim3 grid{cfg.grid.x, cfg.grid.y, cfg.grid.z};
    const ::dim3 block{cfg.block.x, cfg.block.y, cfg.block.z};
#if defined(FERRY_GPU_PROGRAMMATIC_LAUNCH)
    if (cfg.programmatic) {
      FERRY_GPU_PROGRAMMATIC_LAUNCH(k.fn, grid, block, argv, cfg.shared_bytes, s);
      return;
    }
#endif
    FERRY_GPU_TRY(FERRY_GPU(LaunchKernel)(k.fn, grid, block, argv, cfg.shared_bytes, s));
  }

  /// Load a kernel's module now: under lazy loading (CUDA's default since 12.2) a first launch loads the
  /// module, waiting for the running kernels, so one behind a kernel spinning on a CPU flag would deadlock
  /// the thread that must set it; owners (channel, publisher) preload their kernels when constructed.
  /// Returns the virtual architecture of the code that will run (major * 10 + minor; HIP: 0): compute_80
  /// code JIT-compiled on sm_90 reports 80, so a caller can tell if sm_90-only griddepcontrol is in it.
  template <class... Args>
  int preload(kernel_type<Args...> k) const
  {
    FERRY_GPU(FuncAttributes) attr{};
    FERRY_GPU_TRY(FERRY_GPU(FuncGetAttributes)(&attr, k.fn));
    return FERRY_GPU_COMPILED_ARCH(attr);
  }

  // ---- graphs ------------------------------------------------------------------------------------
  void capture_begin(stream_type s) const
  {
    FERRY_GPU_TRY(FERRY_GPU(StreamBeginCapture)(s, FERRY_GPU(StreamCaptureModeThreadLocal)));
  }
  [[nodiscard]] graph_type capture_end(stream_type s) const
  {
    graph_type g{};
    FERRY_GPU_TRY(FERRY_GPU(StreamEndCapture)(s, &g));
    return g;
  }
  [[nodiscard]] graph_exec_type graph_instantiate(graph_type g) const
  {
    graph_exec_type x{};
    FERRY_GPU_TRY(FERRY_GPU(GraphInstantiateWithFlags)(&x, g, 0));
    return x;
  }
  void graph_launch(graph_exec_type x, stream_type s) const { FERRY_GPU_TRY(FERRY_GPU(GraphLaunch)(x, s)); }
  void graph_destroy(graph_type g) const noexcept
  {
    if (g != nullptr) { (void)FERRY_GPU(GraphDestroy)(g); }
  }
  void graph_exec_destroy(graph_exec_type x) const noexcept
  {
    if (x != nullptr) { (void)FERRY_GPU(GraphExecDestroy)(x); }
  }

  /// Raise this backend's own error for a fault injected into `call` (see faulty.hpp).
  [[noreturn]] void raise_injected(call_kind kind, std::string_view call, const char* where) const
  {
    const auto code = kind == call_kind::allocate ? FERRY_GPU(ErrorMemoryAllocation)
                      : kind == call_kind::launch ? FERRY_GPU(ErrorLaunchFailure)
                                                  : FERRY_GPU(ErrorUnknown);
    throw error_type(FERRY_GPU_NAME, static_cast<int>(code), FERRY_GPU(GetErrorName)(code), call, where,
                     "fault injected");
  }

 private:
  /// `p` as written by the allocation that returned `st`; else out_of_memory (error cleared) or FERRY_GPU_ERROR.
  static void* allocated(FERRY_GPU(Error_t) st, void* const& p, const char* memory, std::size_t bytes)
  {
    if (st == FERRY_GPU(ErrorMemoryAllocation)) {
      (void)FERRY_GPU(GetLastError)();
      throw out_of_memory(
        ::ferry::detail::format("ferry: {} {} allocation of {} bytes failed", FERRY_GPU_NAME, memory, bytes));
    }
    FERRY_GPU_TRY(st);
    return p;
  }
};

}  // namespace ferry::backend
