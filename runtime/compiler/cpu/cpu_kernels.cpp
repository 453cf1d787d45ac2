// accrewrite's C++ kernels for the CPU, float32, built at run time (cpu_kernels.py):
// - causal self-attention, forward and backward (attention.py);
// - cross-entropy, forward and backward with the column sums of its gradient (cross_entropy.py).
// Both parallelise over rows of work (a (batch, head) pair, a row of logits), one contiguous
// range per thread, so that each thread's data stays in its cache.

#include <torch/csrc/inductor/cpp_prefix.h>

namespace at::native::cpublas {
// libtorch_cpu's (declared in ATen/native/CPUBlas.h, whose includes take a second to compile):
// C (M x N) = A (M x K) @ B (K x N), plus C where add_C; ld_*: the row strides.
void brgemm(int64_t M, int64_t N, int64_t K, int64_t ld_a, int64_t ld_b, int64_t ld_c,
            bool add_C, const float* A, const float* B, float* C, bool is_vnni);
}  // namespace at::native::cpublas

namespace {

using Vec = at::vec::Vectorized<float>;

// c (m x n) = a (m x k) @ b (k x n), plus c where accumulate
void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
          int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, accumulate, a, b, c, false);
}

// dst (cols x rows) = src^T (rows x cols)
void transpose(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t rows,
               int64_t cols) {
  at::vec::transpose_mxn<float>(src, ld_src, dst, ld_dst, rows, cols);
}

// row[j] = exp(scale * row[j] - shift) for j < valid, 0 for valid <= j < n; returns their sum
float exp_row(float* row, int64_t valid, int64_t n, float scale, float shift) {
  const Vec vscale(scale), vshift(shift);
  Vec sum(0.f);
  int64_t j = 0;
  for (; j + Vec::size() <= valid; j += Vec::size()) {
    const Vec p = (Vec::loadu(row + j) * vscale - vshift).exp_u20();
    p.store(row + j);
    sum = sum + p;
  }
  if (j < valid) {
    const int64_t rest = valid - j;
    // loadu's missing lanes are zeros, whose exp is not: keep the loaded lanes only
    const Vec x = Vec::loadu(row + j, rest) * vscale - vshift;
    const Vec p = Vec::set(Vec(0.f), x.exp_u20(), rest);
    p.store(row + j, rest);
    sum = sum + p;
  }
  std::fill(row + valid, row + n, 0.f);
  return at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, sum);
}

float row_max(const float* row, int64_t size) {
  return at::vec::reduce_all<float>(
      [](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, row, size);
}

float dot(const float* x, const float* y, int64_t size) {
  return at::vec::map2_reduce_all<float>(
      [](Vec a, Vec b) { return a * b; }, [](Vec a, Vec b) { return a + b; }, x, y, size);
}

// The strides of a (batch, heads, tokens, head size) tensor with a contiguous last dimension.
struct Layout {
  int64_t batch, head, token;

  template <typename T>
  T* at(T* base, int64_t b, int64_t h) const {
    return base + b * batch + h * head;
  }
};

// the index-th tensor's layout in strides, 3 per tensor (batch, head, token)
Layout layout(const int64_t* strides, int index) {
  return {strides[3 * index], strides[3 * index + 1], strides[3 * index + 2]};
}

// f(begin, end, thread) over [0, size), one contiguous range per thread. An exception (brgemm's
// where oneDNN's micro-kernel is missing, a bad target) is rethrown here: leaving an OpenMP
// region, it would abort.
template <typename F>
void parallel(int64_t size, int64_t threads, const F& f) {
  std::exception_ptr error;
#pragma omp parallel num_threads(threads)
  {
    const int64_t count = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t chunk = (size + count - 1) / count;
    const int64_t begin = std::min(size, id * chunk), end = std::min(size, begin + chunk);
    try {
      if (begin < end) f(begin, end, id);
    } catch (...) {
#pragma omp critical
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

// --- causal attention ---
//
// Queries go in blocks of `block` (attention.py chooses it); a block attends to the keys up to
// its last query only, so the products skip the masked blocks of the scores. The products run on
// oneDNN's micro-kernel (ATen's cpublas::brgemm); the softmax, its gradient and the transposes
// the products need run on ATen's vector types. Training keeps the rows' log-sum-exp (lse), as
// flash attention does: the backward recomputes each block's probabilities from it.

// out = softmax(q k^T * scale + causal mask) v and lse (batch, heads, tokens: contiguous), the
// rows' log-sum-exp of the scaled scores. strides: those of q, k, v and out.
extern "C" void accrewrite_attention_forward(const float* q, const float* k, const float* v,
                                             float* out, float* lse, const int64_t* strides,
                                             int64_t batch, int64_t heads, int64_t tokens,
                                             int64_t dim, float scale, int64_t block,
                                             int64_t threads) {
  const Layout lq = layout(strides, 0), lk = layout(strides, 1), lv = layout(strides, 2),
               lo = layout(strides, 3);
  parallel(batch * heads, threads, [&](int64_t begin, int64_t end, int64_t) {
    std::vector<float> kt(dim * tokens), s(block * tokens);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, h = bh % heads;
      const float *qb = lq.at(q, b, h), *kb = lk.at(k, b, h), *vb = lv.at(v, b, h);
      float* ob = lo.at(out, b, h);
      float* lseb = lse + bh * tokens;
      transpose(kb, lk.token, kt.data(), tokens, tokens, dim);
      for (int64_t i0 = 0; i0 < tokens; i0 += block) {
        const int64_t m = std::min(block, tokens - i0), n = i0 + m;  // n: keys the block sees
        gemm(m, n, dim, qb + i0 * lq.token, lq.token, kt.data(), tokens, s.data(), tokens,
             false);
        for (int64_t r = 0; r < m; ++r) {
          float* row = s.data() + r * tokens;
          const int64_t valid = i0 + r + 1;
          const float shift = row_max(row, valid) * scale;
          const float sum = exp_row(row, valid, n, scale, shift);
          const Vec inverse(1.f / sum);
          at::vec::map([&](Vec x) { return x * inverse; }, row, row, valid);
          lseb[i0 + r] = shift + std::log(sum);
        }
        gemm(m, dim, n, s.data(), tokens, vb, lv.token, ob + i0 * lo.token, lo.token, false);
      }
    }
  });
}

// dq, dk and dv of the forward's out for its gradient grad. strides: those of q, k, v, out,
// grad, dq, dk and dv.
extern "C" void accrewrite_attention_backward(const float* grad, const float* q, const float* k,
                                              const float* v, const float* out, const float* lse,
                                              float* dq, float* dk, float* dv,
                                              const int64_t* strides, int64_t batch,
                                              int64_t heads, int64_t tokens, int64_t dim,
                                              float scale, int64_t block, int64_t threads) {
  const Layout lq = layout(strides, 0), lk = layout(strides, 1), lv = layout(strides, 2),
               lo = layout(strides, 3), lg = layout(strides, 4), ldq = layout(strides, 5),
               ldk = layout(strides, 6), ldv = layout(strides, 7);
  parallel(batch * heads, threads, [&](int64_t begin, int64_t end, int64_t) {
    // dk and dv are summed transposed (dim x tokens), where each block's product adds to them
    // without transposing the block's scores
    std::vector<float> kt(dim * tokens), vt(dim * tokens), dkt(dim * tokens), dvt(dim * tokens),
        p(block * tokens), dp(block * tokens), qt(dim * block), gt(dim * block);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads, h = bh % heads;
      const float *qb = lq.at(q, b, h), *kb = lk.at(k, b, h), *vb = lv.at(v, b, h),
                  *ob = lo.at(out, b, h), *gb = lg.at(grad, b, h);
      const float* lseb = lse + bh * tokens;
      transpose(kb, lk.token, kt.data(), tokens, tokens, dim);
      transpose(vb, lv.token, vt.data(), tokens, tokens, dim);
      std::fill(dkt.begin(), dkt.end(), 0.f);
      std::fill(dvt.begin(), dvt.end(), 0.f);
      for (int64_t i0 = 0; i0 < tokens; i0 += block) {
        const int64_t m = std::min(block, tokens - i0), n = i0 + m;
        const float* qi = qb + i0 * lq.token;
        const float* gi = gb + i0 * lg.token;
        gemm(m, n, dim, qi, lq.token, kt.data(), tokens, p.data(), tokens, false);
        gemm(m, n, dim, gi, lg.token, vt.data(), tokens, dp.data(), tokens, false);
        for (int64_t r = 0; r < m; ++r) {
          const int64_t valid = i0 + r + 1;
          float* prow = p.data() + r * tokens;
          float* dprow = dp.data() + r * tokens;
          exp_row(prow, valid, n, scale, lseb[i0 + r]);  // the probabilities again
          // the gradient of the scaled scores, times scale: that of q k^T
          const Vec d(dot(gi + r * lg.token, ob + (i0 + r) * lo.token, dim)), vscale(scale);
          at::vec::map2([&](Vec x, Vec y) { return x * (y - d) * vscale; }, dprow, prow, dprow,
                        valid);
          std::fill(dprow + valid, dprow + n, 0.f);
        }
        gemm(m, dim, n, dp.data(), tokens, kb, lk.token, ldq.at(dq, b, h) + i0 * ldq.token,
             ldq.token, false);
        transpose(qi, lq.token, qt.data(), block, m, dim);
        transpose(gi, lg.token, gt.data(), block, m, dim);
        gemm(dim, n, m, qt.data(), block, dp.data(), tokens, dkt.data(), tokens, true);
        gemm(dim, n, m, gt.data(), block, p.data(), tokens, dvt.data(), tokens, true);
      }
      transpose(dkt.data(), tokens, ldk.at(dk, b, h), ldk.token, dim, tokens);
      transpose(dvt.data(), tokens, ldv.at(dv, b, h), ldv.token, dim, tokens);
    }
  });
}

// --- cross-entropy ---
//
// F.cross_entropy(logits, target) with its defaults (the mean over the targets that are not
// ignore_index). A row of logits is read from memory once per pass (the forward's second read,
// for the sum of exponentials, comes from the cache), and the backward adds each row of the
// gradient to its thread's column sums while the row is in registers: the column sums are the
// gradient of the bias of the linear layer that produced the logits, which inductor sums in a
// pass of its own down the columns.

namespace {

void check_target(int64_t t, int64_t classes, int64_t ignore_index) {
  if (t != ignore_index && (t < 0 || t >= classes)) {
    throw std::out_of_range("cross_entropy: target " + std::to_string(t) +
                            " is out of bounds [0, " + std::to_string(classes) + ")");
  }
}

int64_t counted(const int64_t* target, int64_t rows, int64_t ignore_index) {
  return rows - std::count(target, target + rows, ignore_index);
}

}  // namespace

// loss (one value) = mean over counted rows of lse - logits[row, target]; lse (rows): each row's
// log-sum-exp. logits: rows x classes, row stride ld.
extern "C" void accrewrite_cross_entropy_forward(const float* logits, const int64_t* target,
                                                 float* loss, float* lse, int64_t rows,
                                                 int64_t classes, int64_t ld,
                                                 int64_t ignore_index, int64_t threads) {
  std::vector<double> losses(std::max<int64_t>(threads, 1), 0.0);
  parallel(rows, threads, [&](int64_t begin, int64_t end, int64_t thread) {
    for (int64_t i = begin; i < end; ++i) {
      const float* row = logits + i * ld;
      check_target(target[i], classes, ignore_index);
      const float max = row_max(row, classes);
      const Vec vmax(max);
      const float sum = at::vec::map_reduce_all<float>(
          [&](Vec x) { return (x - vmax).exp_u20(); }, [](Vec x, Vec y) { return x + y; }, row,
          classes);
      lse[i] = max + std::log(sum);
      if (target[i] != ignore_index) losses[thread] += lse[i] - row[target[i]];
    }
  });
  double total = 0.0;
  for (double part : losses) total += part;
  *loss = static_cast<float>(total / counted(target, rows, ignore_index));  // 0 / 0: nan, as ATen
}

// grad_logits = grad * (softmax(logits) - one_hot(target)) / counted rows (0 in ignored rows),
// and column_sum (classes) its sums over the rows. partial: threads x classes floats of scratch.
extern "C" void accrewrite_cross_entropy_backward(const float* grad, const float* logits,
                                                  const int64_t* target, const float* lse,
                                                  float* grad_logits, float* column_sum,
                                                  float* partial, int64_t rows, int64_t classes,
                                                  int64_t ld, int64_t ignore_index,
                                                  int64_t threads) {
  const float scale = *grad / counted(target, rows, ignore_index);
  std::fill(partial, partial + threads * classes, 0.f);
  parallel(rows, threads, [&](int64_t begin, int64_t end, int64_t thread) {
    float* sums = partial + thread * classes;
    const Vec vscale(scale);
    for (int64_t i = begin; i < end; ++i) {
      const float* row = logits + i * ld;
      float* grad_row = grad_logits + i * classes;
      const int64_t t = target[i];
      check_target(t, classes, ignore_index);
      if (t == ignore_index) {
        std::fill(grad_row, grad_row + classes, 0.f);
        continue;
      }
      const Vec vlse(lse[i]);
      for (int64_t j = 0; j < classes; j += Vec::size()) {
        const int64_t size = std::min<int64_t>(Vec::size(), classes - j);
        const Vec g = (Vec::loadu(row + j, size) - vlse).exp_u20() * vscale;
        g.store(grad_row + j, size);
        (Vec::loadu(sums + j, size) + g).store(sums + j, size);
      }
      grad_row[t] -= scale;
      sums[t] -= scale;
    }
  });
  for (int64_t j = 0; j < classes; ++j) {
    float sum = 0.f;
    for (int64_t thread = 0; thread < threads; ++thread) sum += partial[thread * classes + j];
    column_sum[j] = sum;
  }
}
