// bostudio's compat header for Vulkan-Headers older than 1.3.261 (Debian 12 ships 1.3.239).
//
// ggml-vulkan.cpp (llama.cpp 0c1e570) always builds a vk::LayerSettingsCreateInfoEXT for the instance, to set
// validate_best_practices when the VK_EXT_layer_settings instance extension is there at run time; older
// headers lack those types, so the build fails with "'LayerSettingEXT' is not a member of 'vk'". This header
// is found first on the include path (-I), includes the real one, and declares the three missing types with
// the layout of VkLayerSettingEXT / VkLayerSettingsCreateInfoEXT. Without the extension at run time
// (Debian 12's loader has none), llama.cpp does not enable it and the chained struct is ignored, as it is
// with newer headers. bostudio.engine.build adds this directory only when vulkan_core.h lacks the extension.
#pragma once
#include_next <vulkan/vulkan.hpp>

#ifndef VK_EXT_layer_settings
#include <cstdint>
#include <vector>

namespace vk {
enum class LayerSettingTypeEXT : int32_t {
    eBool32 = 0, eInt32 = 1, eInt64 = 2, eUint32 = 3, eUint64 = 4, eFloat32 = 5, eFloat64 = 6, eString = 7
};

struct LayerSettingEXT {
    const char * pLayerName;
    const char * pSettingName;
    LayerSettingTypeEXT type;
    uint32_t valueCount;
    const void * pValues;
};

struct LayerSettingsCreateInfoEXT {
    explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT> & settings)
        : settingCount(static_cast<uint32_t>(settings.size())), pSettings(settings.data()) {}
    VkStructureType sType = static_cast<VkStructureType>(1000496000);  // ..._LAYER_SETTINGS_CREATE_INFO_EXT
    const void * pNext = nullptr;
    uint32_t settingCount;
    const LayerSettingEXT * pSettings;
};
}  // namespace vk
#endif
