#include "python/src/proto_dict.h"

#include <google/protobuf/descriptor.h>

#include <string>

namespace kvarn::py {
namespace {

namespace pyb = pybind11;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

pyb::object Scalar(const Message& m, const Reflection& r, const FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return pyb::int_(r.GetInt32(m, f));
    case FieldDescriptor::CPPTYPE_INT64:
      return pyb::int_(r.GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return pyb::int_(r.GetUInt32(m, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return pyb::int_(r.GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return pyb::float_(r.GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return pyb::float_(r.GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return pyb::bool_(r.GetBool(m, f));
    case FieldDescriptor::CPPTYPE_ENUM:
      return pyb::str(r.GetEnum(m, f)->name());
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string s = r.GetString(m, f);
      if (f->type() == FieldDescriptor::TYPE_BYTES) return pyb::bytes(s);
      return pyb::str(s);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageToDict(r.GetMessage(m, f));
  }
  return pyb::none();
}

pyb::object Element(const Message& m, const Reflection& r, const FieldDescriptor* f, int i) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return pyb::int_(r.GetRepeatedInt32(m, f, i));
    case FieldDescriptor::CPPTYPE_INT64:
      return pyb::int_(r.GetRepeatedInt64(m, f, i));
    case FieldDescriptor::CPPTYPE_UINT32:
      return pyb::int_(r.GetRepeatedUInt32(m, f, i));
    case FieldDescriptor::CPPTYPE_UINT64:
      return pyb::int_(r.GetRepeatedUInt64(m, f, i));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return pyb::float_(r.GetRepeatedDouble(m, f, i));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return pyb::float_(r.GetRepeatedFloat(m, f, i));
    case FieldDescriptor::CPPTYPE_BOOL:
      return pyb::bool_(r.GetRepeatedBool(m, f, i));
    case FieldDescriptor::CPPTYPE_ENUM:
      return pyb::str(r.GetRepeatedEnum(m, f, i)->name());
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string s = r.GetRepeatedString(m, f, i);
      if (f->type() == FieldDescriptor::TYPE_BYTES) return pyb::bytes(s);
      return pyb::str(s);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return MessageToDict(r.GetRepeatedMessage(m, f, i));
  }
  return pyb::none();
}

}  // namespace

pyb::dict MessageToDict(const Message& m) {
  pyb::dict d;
  const google::protobuf::Descriptor* desc = m.GetDescriptor();
  const Reflection* r = m.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const FieldDescriptor* f = desc->field(i);
    const pyb::str key(f->name());
    if (f->is_repeated()) {
      pyb::list items;
      for (int k = 0; k < r->FieldSize(m, f); ++k) items.append(Element(m, *r, f, k));
      d[key] = items;
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !r->HasField(m, f)) {
      d[key] = pyb::none();
    } else {
      d[key] = Scalar(m, *r, f);
    }
  }
  return d;
}

}  // namespace kvarn::py
