// The Python module of the compiled CPU sweeps (built by mgrit_gru/kernels/__init__.py).
#include <torch/extension.h>

namespace mgrit {
void gru_forward(const at::Tensor& x0, at::Tensor out, const at::Tensor& gx, const at::Tensor& w_hh,
                 const c10::optional<at::Tensor>& b_hn, const c10::optional<at::Tensor>& g,
                 const c10::optional<at::Tensor>& keep, const c10::optional<at::Tensor>& factor,
                 const c10::optional<at::Tensor>& dt, bool implicit, int64_t pad_c, int64_t pad_lo,
                 int64_t pad_hi, int64_t j0, const c10::optional<at::Tensor>& stored,
                 const c10::optional<at::Tensor>& change);
void gru_adjoint(const at::Tensor& x0, at::Tensor out, const at::Tensor& D, const at::Tensor& C,
                 const at::Tensor& w_hh, const c10::optional<at::Tensor>& g,
                 const c10::optional<at::Tensor>& stored, const c10::optional<at::Tensor>& change);
void lstm_forward(const at::Tensor& x0, at::Tensor out, const at::Tensor& gx, const at::Tensor& w_hh,
                  const c10::optional<at::Tensor>& g, const c10::optional<at::Tensor>& keep,
                  const c10::optional<at::Tensor>& factor, const c10::optional<at::Tensor>& dt,
                  int64_t pad_c, int64_t pad_lo, int64_t pad_hi, int64_t j0,
                  const c10::optional<at::Tensor>& stored, const c10::optional<at::Tensor>& change);
void lstm_adjoint(const at::Tensor& x0, at::Tensor out, const at::Tensor& D, const at::Tensor& C,
                  const at::Tensor& w_hh, const c10::optional<at::Tensor>& g,
                  const c10::optional<at::Tensor>& stored, const c10::optional<at::Tensor>& change);
void gru_serial_adjoint(const at::Tensor& points, const at::Tensor& kept, const at::Tensor& d_out,
                        const at::Tensor& d_last, const c10::optional<at::Tensor>& dt, bool implicit,
                        const at::Tensor& w_hh, at::Tensor d_gx, at::Tensor d_gh, at::Tensor lam0,
                        const c10::optional<at::Tensor>& db_ih, const c10::optional<at::Tensor>& db_hh);
void lstm_serial_adjoint(const at::Tensor& points, const at::Tensor& kept, const at::Tensor& d_out,
                         const at::Tensor& d_last, const c10::optional<at::Tensor>& dt, const at::Tensor& w_hh,
                         at::Tensor d, at::Tensor lam0);
void gru_coefficients(const at::Tensor& points, const at::Tensor& kept, const c10::optional<at::Tensor>& dt,
                      bool implicit, at::Tensor D_rev, at::Tensor C_rev, const c10::optional<at::Tensor>& A_n);
void gru_gate_grads(const at::Tensor& lam_rev, const at::Tensor& C_rev, const at::Tensor& A_n, at::Tensor d_gx,
                    at::Tensor d_gh, const c10::optional<at::Tensor>& db_ih, const c10::optional<at::Tensor>& db_hh);
void lstm_coefficients(const at::Tensor& points, const at::Tensor& kept, const c10::optional<at::Tensor>& dt,
                       at::Tensor D_rev, at::Tensor C_rev);
void lstm_gate_grads(const at::Tensor& lam_rev, const at::Tensor& C_rev, at::Tensor d);
void map_sweep(const at::Tensor& x0, at::Tensor out, const at::Tensor& a, const c10::optional<at::Tensor>& g,
               const c10::optional<at::Tensor>& W, const c10::optional<at::Tensor>& P);
void chunk_product(const at::Tensor& factors, at::Tensor out);
}  // namespace mgrit

// The fine sweeps' arguments by name; stored and change (an early exit's check, fused:
// common.h's checked_blocks) may be left out.
#define MGRIT_CHECK pybind11::arg("stored") = pybind11::none(), pybind11::arg("change") = pybind11::none()

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.def("gru_forward", &mgrit::gru_forward, "", py::arg("x0"), py::arg("out"), py::arg("gx"), py::arg("w_hh"),
        py::arg("b_hn"), py::arg("g"), py::arg("keep"), py::arg("factor"), py::arg("dt"), py::arg("implicit"),
        py::arg("pad_c"), py::arg("pad_lo"), py::arg("pad_hi"), py::arg("j0"), MGRIT_CHECK);
  m.def("gru_adjoint", &mgrit::gru_adjoint, "", py::arg("x0"), py::arg("out"), py::arg("D"), py::arg("C"),
        py::arg("w_hh"), py::arg("g"), MGRIT_CHECK);
  m.def("lstm_forward", &mgrit::lstm_forward, "", py::arg("x0"), py::arg("out"), py::arg("gx"), py::arg("w_hh"),
        py::arg("g"), py::arg("keep"), py::arg("factor"), py::arg("dt"), py::arg("pad_c"), py::arg("pad_lo"),
        py::arg("pad_hi"), py::arg("j0"), MGRIT_CHECK);
  m.def("lstm_adjoint", &mgrit::lstm_adjoint, "", py::arg("x0"), py::arg("out"), py::arg("D"), py::arg("C"),
        py::arg("w_hh"), py::arg("g"), MGRIT_CHECK);
  m.def("gru_serial_adjoint", &mgrit::gru_serial_adjoint, "", pybind11::arg("points"), pybind11::arg("kept"),
        pybind11::arg("d_out"), pybind11::arg("d_last"), pybind11::arg("dt"), pybind11::arg("implicit"),
        pybind11::arg("w_hh"), pybind11::arg("d_gx"), pybind11::arg("d_gh"), pybind11::arg("lam0"),
        pybind11::arg("db_ih") = pybind11::none(), pybind11::arg("db_hh") = pybind11::none());
  m.def("lstm_serial_adjoint", &mgrit::lstm_serial_adjoint);
  m.def("gru_coefficients", &mgrit::gru_coefficients);
  m.def("gru_gate_grads", &mgrit::gru_gate_grads, "", pybind11::arg("lam_rev"), pybind11::arg("C_rev"),
        pybind11::arg("A_n"), pybind11::arg("d_gx"), pybind11::arg("d_gh"), pybind11::arg("db_ih") = pybind11::none(),
        pybind11::arg("db_hh") = pybind11::none());
  m.def("lstm_coefficients", &mgrit::lstm_coefficients);
  m.def("lstm_gate_grads", &mgrit::lstm_gate_grads);
  m.def("map_sweep", &mgrit::map_sweep);  // the coarse levels' chunk maps (core/coarse_cpu.cpp)
  m.def("chunk_product", &mgrit::chunk_product);  // their chunk factors (core/coarse_cpu.cpp)
  // whether at::parallel_for opens OpenMP regions here (the module built with -fopenmp): the
  // sweeps' blocks spread over torch's threads only then
#ifdef INTRA_OP_PARALLEL
  m.attr("threaded") = true;
#else
  m.attr("threaded") = false;
#endif
}
